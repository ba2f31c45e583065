"""Hostile frame lists for ``bench.harness.fuzz``: pure, seeded, no sockets.

Each message is built from a real one of the wire contract (``proto_msgs``), so that the
mutations reach past the header check into msgpack, the field checkers, ``validate`` and the
broker's handlers, and is then one of these kinds:

- ``random``: 1–5 frames of random bytes;
- ``valid``: sent as encoded (valid but hostile: wrong direction, unknown batch ids, an error
  code no one knows, a READY conflicting with the served card, a fake model ...);
- ``truncated``: frames dropped, or one cut short;
- ``bitflip``: 1–8 bits flipped anywhere;
- ``command``: a wrong command byte (unknown, or another message's), magic or version;
- ``huge``: declared lengths far beyond the data (msgpack map/array/str/bin headers, array
  shapes, blob lengths), a body over the size limit, more frames than allowed;
- ``fields``: one body field replaced by a value of another type or out of range.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from proto_msgs import (
    MAGIC,
    REGISTRY,
    VERSION,
    BatchAssign,
    BatchError,
    BatchResult,
    BrokerStats,
    CancelRequest,
    CatalogReply,
    CatalogRequest,
    Disconnect,
    Heartbeat,
    Message,
    ModelInfo,
    OutputOptions,
    Ping,
    Pong,
    RequestError,
    RequestResult,
    SubmitRequest,
    TokenizerReply,
    TokenizerRequest,
    WorkerReady,
    encode,
    limits,
)

Frames = list[bytes]
KINDS = ("random", "valid", "truncated", "bitflip", "command", "huge", "fields")
WEIGHTS = (15, 10, 15, 25, 10, 10, 15)
FAKE_MODELS = 4  # fuzz-model-0..3: few names, so a fuzz run does not grow the catalog itself
FAKE_TOKENIZER = b"{}"
_HEADER = struct.Struct("<2sBB")


def fake_card(k: int, name: str | None = None, dims: int = 4) -> ModelInfo:
    return ModelInfo(
        name=name or f"fuzz-model-{k}",
        aliases=[],
        dims=dims,
        max_input_tokens=8,
        vocab_size=10,
        pooling="mean",
        normalize=True,
        tokenizer_digest=hashlib.sha256(FAKE_TOKENIZER).hexdigest(),
    )


def _ids(rng: random.Random, n: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = [rng.randint(1, 4) for _ in range(n)]
    ids = np.array([rng.randrange(vocab) for _ in range(sum(lengths))], dtype=np.int32)
    return ids, np.array([0, *np.cumsum(lengths)], dtype=np.int32)


class Templates:
    """Real messages of every class, with hostile values, for one side of the broker.

    ``model`` is the model really served: a submit for it is rare and tiny (so the fuzz does
    not become a load test of the worker), and a READY for it always conflicts with its card.
    """

    def __init__(self, model: str, rng: random.Random) -> None:
        self.model = model
        self.rng = rng
        front: list[tuple[float, Callable[[], Message]]] = [
            (3, lambda: Ping(self.cid())),
            (2, lambda: CatalogRequest(self.cid())),
            (2, lambda: TokenizerRequest(self.cid(), self.rng.randbytes(32).hex())),
            (2, lambda: CancelRequest(self.cid())),
            (3, lambda: self.submit(self.rng.choice(["no-such-model", "", "x" * 300]), 10)),
            (3, lambda: self.submit(f"fuzz-model-{self.rng.randrange(FAKE_MODELS)}", 10)),
            (2, lambda: self.submit(model, 10**6)),  # outside the vocabulary: refused
            (0.2, lambda: self.submit(model, 1000)),  # valid, three tokens or so
        ]
        back: list[tuple[float, Callable[[], Message]]] = [
            (1, lambda: self.ready(fake_card(self.rng.randrange(FAKE_MODELS)))),
            (0.5, lambda: self.ready(fake_card(0, name=model, dims=1))),  # conflicts
            (0.5, lambda: self.ready(fake_card(1), tokenizer=b"not the digest")),
            (3, lambda: Heartbeat(self.rng.randrange(2**40), self.rng.random() < 0.5)),
            (3, lambda: self.result(self.rng.randrange(2**40))),
            (2, lambda: BatchError(self.rng.randrange(2**40), self.rng.choice([0, 999, -1]), "x", False)),
            (2, lambda: BatchError(self.rng.randrange(2**40), 9, "boom", self.rng.random() < 0.5)),
            (0.5, lambda: Disconnect("fuzz")),
        ]  # fmt: skip
        # Every message of the other direction too, where it has no business arriving.
        strays: list[tuple[float, Callable[[], Message]]] = [
            (0.5, lambda: RequestResult(self.cid(), 3, np.array([0], np.int32), np.ones((1, 4), np.float32))),
            (0.5, lambda: RequestError(self.cid(), 999, "stray")),
            (0.5, lambda: CatalogReply(self.cid(), [fake_card(0)])),
            (0.5, lambda: TokenizerReply(self.cid(), "0" * 64, True, b"{}")),
            (0.5, lambda: Pong(self.cid(), BrokerStats(dropped_frames=-1), 7)),
            (0.5, lambda: self.assign()),
        ]  # fmt: skip
        self.front = front + strays + back[:1] + back[3:5]
        self.back = back + strays + front[:1] + front[4:5]

    def cid(self) -> int:
        return self.rng.choice([self.rng.randrange(2**31), 0, 2**63 - 1, -5])

    def submit(self, model: str, vocab: int) -> SubmitRequest:
        ids, offsets = _ids(self.rng, self.rng.randint(1, 3), vocab)
        return SubmitRequest(
            cid=self.cid(),
            model=model,
            lane=self.rng.choice([0, 1]),
            timeout_ms=self.rng.choice([None, 5_000, 1]),
            output=OutputOptions(dims=self.rng.choice([None, 2, 1000])),
            token_ids=ids,
            offsets=offsets,
        )

    def ready(self, card: ModelInfo, tokenizer: bytes = FAKE_TOKENIZER) -> WorkerReady:
        # A short heartbeat: the fake worker is buried soon after this socket falls silent.
        return WorkerReady("fuzz", card, tokenizer, 64, 8, self.rng.randint(1, 4), 100, "fuzz")

    def result(self, batch_id: int) -> BatchResult:
        rows = self.rng.randint(0, 3)
        embeddings = [np.ones((rows, self.rng.choice([1, 4])), np.float32)]
        return BatchResult(batch_id, self.rng.random(), embeddings * self.rng.randint(1, 2))

    def assign(self) -> BatchAssign:
        ids, offsets = _ids(self.rng, 2, 10)
        return BatchAssign(
            self.rng.randrange(2**40), "fuzz-model-0", 1000, [OutputOptions()],
            np.zeros(2, np.int32), ids, offsets,
        )  # fmt: skip

    def pick(self, side: str) -> Message:
        table = self.front if side == "front" else self.back
        _, make = self.rng.choices(table, weights=[w for w, _ in table])[0]
        return make()


def as_bytes(frames: list[Any]) -> Frames:
    return [bytes(memoryview(f)) for f in frames]


class Mutator:
    """Frame lists of the advertised kinds for one side (``front`` or ``back``)."""

    def __init__(self, model: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.templates = Templates(model, self.rng)

    def next(self, side: str) -> tuple[str, Frames]:
        kind = self.rng.choices(KINDS, weights=WEIGHTS)[0]
        return kind, self.make(kind, side)

    def make(self, kind: str, side: str) -> Frames:
        if kind == "random":
            return [
                self.rng.randbytes(self.rng.randrange(64)) for _ in range(self.rng.randint(1, 5))
            ]
        frames = as_bytes(encode(self.templates.pick(side)))
        return getattr(self, f"_{kind}")(frames)

    def _valid(self, frames: Frames) -> Frames:
        return frames

    def _truncated(self, frames: Frames) -> Frames:
        rng = self.rng
        if len(frames) > 1 and rng.random() < 0.5:
            return frames[: rng.randrange(1, len(frames))]
        i = rng.randrange(len(frames))
        frames[i] = frames[i][: rng.randrange(max(1, len(frames[i])))]
        return frames

    def _bitflip(self, frames: Frames) -> Frames:
        rng = self.rng
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(frames))
            if not frames[i]:
                continue
            buf = bytearray(frames[i])
            bit = rng.randrange(8 * len(buf))
            buf[bit // 8] ^= 1 << (bit % 8)
            frames[i] = bytes(buf)
        return frames

    def _command(self, frames: Frames) -> Frames:
        rng = self.rng
        magic, version, command = MAGIC, VERSION, rng.choice([*REGISTRY, 0, 0x0F, 0x16, 0xFF])
        which = rng.random()
        if which < 0.15:
            magic = rng.randbytes(2)
        elif which < 0.3:
            version = rng.choice([0, VERSION + 1, 255])
        frames[0] = _HEADER.pack(magic, version, command)
        return frames

    def _huge(self, frames: Frames) -> Frames:
        rng = self.rng
        which = rng.randrange(5)
        if which == 0:  # a msgpack container or string declaring 4 G entries, followed by little
            head = rng.choice([b"\xdf", b"\xdd", b"\xdb", b"\xc6", b"\xc9"]) + b"\xff\xff\xff\xff"
            frames[1] = head + rng.randbytes(rng.randrange(16))
        elif which == 1:  # payload descriptors with absurd shapes or lengths
            body = msgpack.unpackb(frames[1], raw=False)
            big = rng.choice([2**31, 2**40, 2**63 - 1, limits.MAX_ARRAY_BYTES + 1])
            body["_a"] = [[d[0], d[1], [big, big] if d[1] != "bytes" else big] for d in body["_a"]]
            body["_a"] = body["_a"] or [["token_ids", "int32", [big]]]
            frames[1] = msgpack.packb(body, use_bin_type=True)
        elif which == 2:  # a string field far over MAX_STRING
            body = msgpack.unpackb(frames[1], raw=False)
            key = rng.choice([k for k in body if k != "_a"] or ["model"])
            body[key] = "x" * (limits.MAX_STRING + rng.randint(1, 1000))
            frames[1] = msgpack.packb(body, use_bin_type=True)
        elif which == 3:  # more frames than a message may have
            frames = frames + [b"\0"] * (limits.MAX_FRAMES + 1 - len(frames) + rng.randrange(4))
        elif rng.random() < 0.005:  # rarely: a real body over the size limit (4 MiB of it)
            frames[1] = (
                b"\xc6" + struct.pack(">I", limits.MAX_BODY_BYTES) + bytes(limits.MAX_BODY_BYTES)
            )
        else:  # a list declaring more entries than a message may carry
            frames[1] = b"\x81\xa2_a\xdd" + struct.pack(">I", limits.MAX_SEQUENCES + 1)
        return frames

    def _fields(self, frames: Frames) -> Frames:
        rng = self.rng
        body = msgpack.unpackb(frames[1], raw=False)
        keys = [k for k in body if k != "_a"]
        odd = [None, -1, 0, 2**64 - 1, -(2**63), 1.5, float("nan"), True, "", "x" * 64,
               [], [1, [2, [3]]], {}, {"k": "v"}, b"\xff\xfe"]  # fmt: skip
        if keys and rng.random() < 0.85:
            body[rng.choice(keys)] = rng.choice(odd)
        elif keys and rng.random() < 0.5:
            del body[rng.choice(keys)]
        else:
            body[rng.choice(["_a", "zz", "cid"])] = rng.choice(odd)
        frames[1] = msgpack.packb(body, use_bin_type=True)
        return frames

"""The two kinds of peer ``bench.harness.fuzz`` puts on a live broker: hostile DEALERs sending what
``bench.harness.fuzz_frames`` makes, and one legitimate ``MeshClient`` (in its own process) whose
results must not change while they do.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from bench.harness.fuzz_frames import Frames, Mutator
from mesh.client import MeshClient
from mesh.errors import MeshError
from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    CancelRequest,
    CatalogRequest,
    Ping,
    ProtocolError,
    SubmitRequest,
    TokenizerRequest,
    decode,
    encode,
)

# What the broker acts on per side; any other message it counts as dropped (on the backend
# only once the sender has registered: an unknown peer is told to READY instead).
FRONT_ACCEPTS = (SubmitRequest, CancelRequest, Ping, CatalogRequest, TokenizerRequest)
LEGIT_TEXTS = [
    "the legitimate client keeps asking the same thing",
    "a second sentence, a little longer than the first, to make two lengths",
    "short",
    "what is the capital of france",
]
LEGIT_TOLERANCE = 1e-3  # the same texts in other batch shapes: fp32 order of sums only
SNDHWM = 1000  # queued in this process per socket; past it a send is refused and retried


@dataclass
class FuzzCounts:
    """What the fuzzing peers sent (only messages zmq accepted) and what came back."""

    messages: int = 0
    frames: int = 0  # ZeroMQ parts of those messages
    bytes: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    by_side: Counter[str] = field(default_factory=Counter)
    # Messages the broker must drop: our own decode refuses them, or they arrive on the
    # frontend where their class has no business. A lower bound of its dropped_frames.
    must_drop: int = 0
    decoded_as: Counter[str] = field(default_factory=Counter)  # the valid ones, by class
    local_decode_bugs: list[str] = field(default_factory=list)  # decode raised non-Protocol
    replies: Counter[str] = field(default_factory=Counter)
    sockets_opened: int = 0

    def add(self, side: str, kind: str, frames: Frames) -> None:
        """Count one message zmq took, and whether the broker must drop it."""
        self.messages += 1
        self.frames += len(frames)
        self.bytes += sum(len(f) for f in frames)
        self.by_kind[kind] += 1
        self.by_side[side] += 1
        try:
            msg = decode(frames)
        except ProtocolError:
            self.must_drop += 1
            return
        except Exception as exc:  # decode promises ProtocolError only: a bug of the codec
            self.must_drop += 1
            if len(self.local_decode_bugs) < 20:
                self.local_decode_bugs.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        self.decoded_as[f"{side}:{type(msg).__name__}"] += 1
        if side == "front" and not isinstance(msg, FRONT_ACCEPTS):
            self.must_drop += 1


class FuzzPeer:
    """One DEALER on one side of the broker; a new identity each time it is reopened."""

    def __init__(self, ctx: zmq.Context, endpoint: str, side: str) -> None:
        self.ctx, self.endpoint, self.side = ctx, endpoint, side
        self.sock = self._open()
        self.pending: tuple[str, Frames] | None = None  # refused by a full queue, sent next

    def _open(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.RCVHWM, SNDHWM)
        sock.setsockopt(zmq.LINGER, 30_000)  # a reopen still delivers what it had queued
        sock.connect(self.endpoint)
        return sock

    def reopen(self) -> None:
        self.sock.close()
        self.sock = self._open()

    def close(self) -> None:
        self.sock.close(linger=0)


class Fuzzer:
    """Round-robin over the peers, each sending the mutator's frames as fast as zmq takes
    them; replies are read (so the broker's queues to us stay short) and a BatchAssign to a
    fake worker of ours is answered with a hostile result for that very batch."""

    def __init__(self, front: str, back: str, model: str, sockets: int, seed: int) -> None:
        self.ctx = zmq.Context()
        self.peers = [
            FuzzPeer(self.ctx, front if i % 2 == 0 else back, "front" if i % 2 == 0 else "back")
            for i in range(sockets)
        ]
        self.mutator = Mutator(model, seed)
        self.rng = random.Random(seed + 1)
        self.counts = FuzzCounts(sockets_opened=sockets)

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
        self.ctx.term()

    def send_round(self) -> int:
        """One message offered to every peer; how many zmq took."""
        taken = 0
        for peer in self.peers:
            if peer.pending is None:
                peer.pending = self.mutator.next(peer.side)
            kind, frames = peer.pending
            try:
                peer.sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                continue
            peer.pending = None
            self.counts.add(peer.side, kind, frames)
            taken += 1
        return taken

    def read_replies(self) -> None:
        for peer in self.peers:
            for _ in range(SNDHWM):
                try:
                    frames = peer.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = decode(frames)
                except ProtocolError:
                    self.counts.replies["undecodable"] += 1
                    continue
                self.counts.replies[type(msg).__name__] += 1
                if isinstance(msg, BatchAssign) and peer.side == "back":
                    self._answer(peer, msg)

    def _answer(self, peer: FuzzPeer, batch: BatchAssign) -> None:
        """What a broken or malicious worker might send back for a batch it really holds."""
        rng, n = self.rng, batch.n
        width = rng.choice([1, 4, 5])
        choices = [
            BatchResult(batch.batch_id, 1.0, [np.ones((n, 4), np.float32)]),  # well formed
            BatchResult(batch.batch_id, 1.0, [np.ones((n + 1, width), np.float32)]),
            BatchResult(batch.batch_id, -1.0, [np.full((n, 4), np.nan, np.float32)] * 2),
            BatchResult(batch.batch_id, 1.0, []),
            BatchResult(batch.batch_id, 1.0, [np.ones((n, 4), np.int8)]),
            BatchError(batch.batch_id, 999, "unknown code", False),
            BatchError(batch.batch_id, 9, "internal", rng.random() < 0.5),
        ]
        answer = encode(rng.choice(choices))
        frames = [bytes(memoryview(f)) for f in answer]
        try:
            peer.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return
        self.counts.add(peer.side, "answer", frames)

    def rotate(self) -> None:
        """A fresh identity for one peer: the broker meets new peers all run long."""
        self.rng.choice(self.peers).reopen()
        self.counts.sockets_opened += 1


def broker_stats(ctx: zmq.Context, front: str, timeout_s: float = 10.0) -> Any:
    """The broker's BrokerStats from one Ping on a fresh socket; None when it does not answer."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(front)
    try:
        sock.send_multipart(encode(Ping(cid=1)))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000)):
            try:
                msg = decode(sock.recv_multipart())
            except ProtocolError:
                continue
            if getattr(msg, "cid", None) == 1 and hasattr(msg, "stats"):
                return msg.stats
        return None
    finally:
        sock.close()


# ---- the legitimate client, in a process of its own ----------------------------------------------

OK, ERRORS, WRONG = range(3)  # slots of its shared counter array


def legit_main(front: str, model: str, counters: Any, events: Any, ready: Any, stop: Any) -> None:
    """Embed LEGIT_TEXTS until ``stop``; every answer must equal the first one."""
    asyncio.run(_legit(front, model, counters, events, ready, stop))


async def _legit(front: str, model: str, counters: Any, events: Any, ready: Any, stop: Any) -> None:
    async with MeshClient(front) as client:
        await client.wait_ready(180, model)
        reference = (await client.embed(LEGIT_TEXTS, model, timeout_s=120)).embeddings
        events.put(("reference", reference[:, :4].tolist()))
        ready.set()
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                got = (await client.embed(LEGIT_TEXTS, model, timeout_s=30)).embeddings
            except MeshError as exc:
                counters[ERRORS] += 1
                events.put(("error", f"{time.time():.0f} {type(exc).__name__}: {exc}"))
            else:
                if (
                    got.shape == reference.shape
                    and np.abs(got - reference).max() <= LEGIT_TOLERANCE
                ):
                    counters[OK] += 1
                else:
                    counters[WRONG] += 1
                    events.put(("error", f"{time.time():.0f} wrong vectors, shape {got.shape}"))
            events.put(("latency", time.monotonic() - t0))
            await asyncio.sleep(0.05)

"""A Broker driven without sockets: fake ROUTERs that queue what peers send and record replies."""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from typing import Any

import numpy as np
import zmq

from mesh.broker.server import Broker, BrokerOptions
from proto_msgs import (
    BatchAssign,
    BatchResult,
    Message,
    ModelInfo,
    OutputOptions,
    RequestResult,
    SubmitRequest,
    WorkerReady,
    decode,
    encode,
)

MODEL = "m"
DIMS = 8
INGRESS = b"ingress"


class FakeRouter:
    """Stands in for a ROUTER: ``inbox`` is what peers sent, ``sent`` what the broker sent."""

    def __init__(self) -> None:
        self.inbox: deque[deque[zmq.Frame]] = deque()
        self.sent: list[tuple[bytes, Message]] = []
        self._sending: list[bytes] = []  # frames of a message sent in part (zmq.SNDMORE)

    def get(self, option: int) -> int:
        """``zmq.EVENTS``: readable while peers' messages wait."""
        assert option == zmq.EVENTS
        return zmq.POLLIN if self.inbox else 0

    def recv(self, flags: int = 0, copy: bool = True) -> zmq.Frame:
        """The next frame of the waiting messages, its ``more`` set as zmq sets it."""
        if not self.inbox:
            raise zmq.Again()
        message = self.inbox[0]
        frame = message.popleft()
        frame.more = bool(message)
        if not message:
            self.inbox.popleft()
        return frame

    def send(self, data: Any, flags: int = 0, copy: bool = True) -> None:
        """One frame; the message is complete at the first without ``zmq.SNDMORE``."""
        self._sending.append(bytes(memoryview(data)))
        if not flags & zmq.SNDMORE:
            identity, *rest = self._sending
            self._sending = []
            self.sent.append((identity, decode(rest)))

    def push(self, identity: bytes, msg: Message | list[bytes]) -> None:
        frames = msg if isinstance(msg, list) else encode(msg)
        self.inbox.append(deque([zmq.Frame(identity), *(zmq.Frame(bytes(f)) for f in frames)]))

    def take(self, kind: type | None = None) -> list[tuple[bytes, Any]]:
        """What was sent since the last take (of ``kind`` only, when given)."""
        taken, self.sent = self.sent, []
        return [(i, m) for i, m in taken if kind is None or isinstance(m, kind)]


def card(name: str = MODEL, **changes: Any) -> ModelInfo:
    fields = dict(
        name=name,
        aliases=[],
        dims=DIMS,
        max_input_tokens=16,
        vocab_size=100,
        pooling="mean",
        normalize=True,
        tokenizer_digest=hashlib.sha256(b"{}").hexdigest(),
        hidden_size=DIMS,  # it serves span rows
    )
    return ModelInfo(**{**fields, **changes})


def ready(model: ModelInfo | None = None, **changes: Any) -> WorkerReady:
    fields = dict(
        name="w",
        model=model or card(),
        tokenizer_json=b"{}",
        max_batch_tokens=64,
        max_batch_requests=16,
        credits=1,
        heartbeat_ms=1000,
        device="cpu",
    )
    return WorkerReady(**{**fields, **changes})


def submit(
    cid: int,
    lengths: list[int],
    *,
    lane: int = 0,
    dims: int | None = None,
    token: int = 5,
    model: str = MODEL,
) -> SubmitRequest:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return SubmitRequest(
        cid=cid,
        model=model,
        lane=lane,
        timeout_ms=None,
        output=OutputOptions(dims=dims),
        token_ids=np.full(int(offsets[-1]), token, dtype=np.int32),
        offsets=offsets,
    )


def answer(batch: BatchAssign) -> BatchResult:
    """A well-formed result for ``batch``: one row per sequence in each output group."""
    rows = [int(np.sum(batch.output_index == g)) for g in range(len(batch.outputs))]
    embeddings = [
        np.ones((n, opt.dims or DIMS), dtype=np.float32)
        for n, opt in zip(rows, batch.outputs, strict=True)
    ]
    return BatchResult(batch_id=batch.batch_id, compute_ms=1.0, embeddings=embeddings)


def slow_answer(batch: BatchAssign, compute_ms: float = 50.0) -> BatchResult:
    """``answer`` with a compute time a real worker gives a query (its fixed cost): any
    batch's rate may raise the broker's, and 1 ms would claim thousands of tokens a second."""
    return dataclasses.replace(answer(batch), compute_ms=compute_ms)


class Harness:
    """A Broker on fake sockets; ``pump`` runs what the loop does for the queued messages."""

    def __init__(self, **options: Any) -> None:
        self.front = FakeRouter()
        self.back = FakeRouter()
        self.broker = Broker(self.front, self.back, BrokerOptions(**options))  # type: ignore[arg-type]
        self.now = 0.0

    def pump(self) -> None:
        self.broker._drain(self.back, self.broker._on_backend, self.now)
        self.broker._drain(self.front, self.broker._on_frontend, self.now)

    def add_worker(self, identity: bytes = b"w1", msg: WorkerReady | None = None) -> None:
        self.back.push(identity, msg or ready())
        self.pump()

    def submit(self, msg: SubmitRequest) -> None:
        self.front.push(INGRESS, msg)
        self.pump()

    def answered_chunk(self, **result: Any) -> RequestResult:
        """The result chunk of a one-sequence request (cid 1) answered by its worker with
        ``result``'s fields in its BatchResult."""
        self.submit(submit(1, [3]))
        [(identity, batch)] = self.back.take(BatchAssign)
        self.back.push(identity, dataclasses.replace(answer(batch), **result))
        self.pump()
        [(_, chunk)] = self.front.take(RequestResult)
        return chunk

    def make_live(self, cid: int = 100) -> None:
        """A query (one sequence of id 7) sent, dispatched and answered: the model is live."""
        self.submit(submit(cid, [4], lane=0, token=7))
        [(identity, live)] = self.back.take(BatchAssign)
        assert set(live.token_ids.tolist()) == {7}
        self.back.push(identity, slow_answer(live))
        self.pump()

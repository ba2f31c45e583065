"""WorkerServer against a ROUTER standing in for the broker: every batch gets exactly one
reply, in order, and a reply that cannot be built becomes a retryable BatchError instead of
ending the finisher thread (which would silence the worker for good); replies carry the
worker's hop timings."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import zmq

from mesh.config import Liveness
from mesh.worker.server import WorkerOptions, WorkerServer
from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    Disconnect,
    ErrorCode,
    Heartbeat,
    ModelInfo,
    OutputOptions,
    WorkerReady,
    decode,
    encode,
)

DIMS = 8


class SumEngine:
    device = torch.device("cpu")

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        sums = np.add.reduceat(ids.astype(np.float32), offsets[:-1])
        return torch.from_numpy(sums)[:, None] * torch.arange(1, DIMS + 1, dtype=torch.float32)


def _assign(batch_id: int) -> BatchAssign:
    return BatchAssign(
        batch_id=batch_id,
        model="m",
        timeout_ms=10_000,
        outputs=[OutputOptions(normalize=False)],
        output_index=np.zeros(2, dtype=np.int32),
        token_ids=np.array([1, 2, 3, batch_id], dtype=np.int32),
        offsets=np.array([0, 2, 4], dtype=np.int32),
    )


def _next_reply(router: zmq.Socket):
    while True:
        assert router.poll(10_000), "no reply from the worker"
        msg = decode(router.recv_multipart()[1:])
        if not isinstance(msg, Heartbeat):
            return msg


@contextmanager
def serving(engine: SumEngine, endpoint: str) -> Iterator[tuple[zmq.Socket, bytes, WorkerServer]]:
    """A running WorkerServer around ``engine``, the ROUTER it said READY to, and its
    identity there; stopped (and its thread joined) on exit."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    info = ModelInfo("m", [], DIMS, 512, 1000, "mean", False, "0" * 64)
    options = WorkerOptions("w", 2, 1024, 64, "cpu")
    server = WorkerServer(ctx, engine, info, b"{}", endpoint, options, Liveness(interval_s=0.5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert router.poll(10_000)
        identity, *frames = router.recv_multipart()
        assert isinstance(decode(frames), WorkerReady)
        yield router, identity, server
    finally:
        server.stop()
        thread.join(10)
        router.close(linger=0)
        ctx.destroy(linger=0)  # as the worker role does: the link's inproc PULL stays open
    assert not thread.is_alive()


def test_every_batch_gets_one_reply_even_when_building_one_fails() -> None:
    with serving(SumEngine(), "inproc://fake-broker") as (router, identity, server):
        real_collect = server.pipeline.collect

        def collect(launched):  # batch 2's results come back in a dtype the wire refuses
            groups, ms = real_collect(launched)
            if launched.batch_id == 2:
                groups = [g.astype(np.complex64) for g in groups]
            return groups, ms

        server.pipeline.collect = collect  # type: ignore[method-assign]
        for batch_id in (1, 2, 3):
            router.send_multipart([identity, *encode(_assign(batch_id))])
        replies = [_next_reply(router) for _ in range(3)]
    assert [r.batch_id for r in replies] == [1, 2, 3]
    ok1, failed, ok3 = replies
    assert isinstance(ok1, BatchResult) and isinstance(ok3, BatchResult)
    assert isinstance(failed, BatchError) and failed.code == ErrorCode.INTERNAL
    assert failed.retryable
    want = np.array([[3.0], [3.0 + 3]]) * np.arange(1, DIMS + 1)
    np.testing.assert_allclose(ok3.embeddings[0], want)
    # Counted after each send, so only certain once the loop has stopped.
    assert server.stats.batches == 3 and server.link.progress == 3


class SleepyEngine(SumEngine):
    def __init__(self, delay_s: float, started: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.started = started or threading.Event()

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        self.started.set()
        time.sleep(self.delay_s)
        return super().embed(ids, offsets)


def test_a_batch_in_flight_at_stop_is_answered_before_the_disconnect() -> None:
    engine = SleepyEngine(0.5)
    with serving(engine, "inproc://fake-broker-2") as (router, identity, server):
        router.send_multipart([identity, *encode(_assign(7))])
        assert engine.started.wait(10)
        server.stop()  # while batch 7 is still computing
        reply = _next_reply(router)
        assert isinstance(reply, BatchResult) and reply.batch_id == 7
        assert isinstance(_next_reply(router), Disconnect)


def test_a_reply_carries_the_workers_hop_timings() -> None:
    delay_s = 0.05
    with serving(SleepyEngine(delay_s), "inproc://fake-broker-3") as (router, identity, _):
        router.send_multipart([identity, *encode(_assign(1))])
        reply = _next_reply(router)
    assert isinstance(reply, BatchResult)
    assert set(reply.timings) == {"worker_wait", "worker_compute", "worker_reply"}
    assert all(math.isfinite(v) and v >= 0 for v in reply.timings.values())
    # The compute stamps bracket the engine call: its sleep is a floor, not a timing target.
    assert reply.timings["worker_compute"] >= delay_s * 1000

"""The worker's live lane (mesh.worker.live_lane) on CPU, with fake engines: READY keeps a
credit for it; a small batch that arrives while the compute thread is busy is answered on the
link thread by the lane's sibling engine, before the bulk batch it would have waited behind;
what is too large or too slow for the lane still goes through the compute thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import zmq

from mesh.config import Liveness
from mesh.worker.server import INLINE_MAX_TOKENS, LoopStats, WorkerOptions, WorkerServer
from proto_msgs import BatchResult, ModelInfo, encode
from tests.unit.worker.worker_fakes import DIMS, SumEngine, assign, next_reply, serving

ANY_TIME_MS = 60_000.0  # an inline bound no batch passes: which path runs never depends on load
BIG = INLINE_MAX_TOKENS + 1
# Every graph bucket up to the lane's 1,024 tokens (gpu.bucket_sizes): all captured at start.
LANE_BUCKETS = [16, 32, 64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1024]


class LaneSpy(SumEngine):
    """Records (engine, thread) per batch; its live_lane sibling shares the record. The
    main engine holds a big batch (a busy GPU) until ``release`` is set, ``delay_s`` at most;
    the sibling sleeps ``lane_delay_s`` on every batch."""

    vocab_size = 1000

    def __init__(self, delay_s: float = 0.0, lane_delay_s: float = 0.0, role: str = "main") -> None:
        self.delay_s, self.lane_delay_s, self.role = delay_s, lane_delay_s, role
        self.log: list[tuple[str, str, int]] = []
        self.big_started = threading.Event()
        self.release = threading.Event()
        self.warmed: list[int] = []
        self.lane: LaneSpy | None = None

    def live_lane(self, max_tokens: int) -> LaneSpy:
        lane = LaneSpy(self.lane_delay_s, self.lane_delay_s, role=f"live<={max_tokens}")
        lane.log = self.log
        self.lane = lane
        return lane

    def warmup(self, buckets: list[int]) -> None:
        self.warmed = buckets

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        self.log.append((self.role, threading.current_thread().name, len(ids)))
        if self.role == "main" and len(ids) > INLINE_MAX_TOKENS:
            self.big_started.set()
            self.release.wait(self.delay_s)
        elif self.role != "main":
            time.sleep(self.delay_s)
        return super().embed(ids, offsets)


def _queries_past_held_bulk(
    engine: LaneSpy, endpoint: str, inline_max_ms: float, queries: tuple[int, ...]
) -> tuple[list, WorkerServer]:
    """A worker with a lane holds bulk batch 1 on its compute thread until the ``queries``
    (small batches) are answered, then lets it end: every reply in arrival order, and the
    server (stopped)."""
    with serving(engine, endpoint, inline_max_ms, 3, live_lane=True) as (router, identity, server):
        router.send_multipart([identity, *encode(assign(1, BIG))])
        assert engine.big_started.wait(10)  # the compute thread is inside the bulk batch
        try:
            for batch_id in queries:
                router.send_multipart([identity, *encode(assign(batch_id))])
            replies = [next_reply(router) for _ in queries]
        finally:
            engine.release.set()
        replies.append(next_reply(router))
    return replies, server


def test_ready_keeps_a_credit_and_says_how_large_a_live_batch_may_be() -> None:
    engine = LaneSpy()
    with serving(engine, "inproc://live-1", ANY_TIME_MS, 3, live_lane=True) as (_, _, server):
        ready = server.ready_sent  # type: ignore[attr-defined]
    assert (ready.credits, ready.live_credits, ready.live_tokens) == (3, 1, INLINE_MAX_TOKENS)
    # The lane warmed up every bucket at start and ran one query-sized batch to time it.
    assert engine.lane is not None and engine.lane.warmed == LANE_BUCKETS
    assert engine.log[:2] == [(f"live<={INLINE_MAX_TOKENS}", threading.main_thread().name, 16)] * 2


def test_without_a_live_lane_ready_keeps_nothing() -> None:
    with serving(LaneSpy(), "inproc://live-2", ANY_TIME_MS) as (_, _, server):
        ready = server.ready_sent  # type: ignore[attr-defined]
    assert (ready.live_credits, ready.live_tokens) == (0, 0)


def test_small_batches_pass_a_busy_compute_thread_on_the_live_lane() -> None:
    engine = LaneSpy(delay_s=30.0)  # the bulk batch ends when the queries are answered
    replies, server = _queries_past_held_bulk(engine, "inproc://live-3", ANY_TIME_MS, (2, 3, 4))
    # The queries come back while the bulk batch still computes, and right.
    assert [r.batch_id for r in replies] == [2, 3, 4, 1]
    for r in replies[:3]:
        assert isinstance(r, BatchResult)
        want = (3.0 + r.batch_id) * np.arange(1, DIMS + 1)
        np.testing.assert_allclose(r.embeddings[0][1], want)
    ran = [(role, thread) for role, thread, tokens in engine.log[2:]]  # after the warm-up
    lane = f"live<={INLINE_MAX_TOKENS}"
    assert ran[0][0] == "main" and ran[0][1] != "broker-link"
    assert ran[1:] == [(lane, "broker-link")] * 3
    assert server.stats.live == 3 and server.stats.inline == 3 and server.stats.batches == 4


def test_batches_over_the_lanes_size_still_go_through_the_compute_thread() -> None:
    engine = LaneSpy()
    tokens, why = BIG, "over the lane's size"
    endpoint = f"inproc://live-4-{tokens}"
    with serving(engine, endpoint, ANY_TIME_MS, 3, live_lane=True) as (
        router,
        identity,
        server,
    ):
        for batch_id in (1, 2):
            router.send_multipart([identity, *encode(assign(batch_id, tokens))])
            assert isinstance(next_reply(router), BatchResult), why
    threads = [thread for _, thread, _ in engine.log[2:]]
    assert len(threads) == 2 and "broker-link" not in threads, why
    assert server.stats.live == 0, why


def test_a_lane_found_slow_once_is_timed_again_instead_of_shut_for_good() -> None:
    # Its warm-up ran over the bound (as one batch beside bulk may: a GC pause), so the next
    # batch goes to the lane's own thread, which times it: quick again, the link thread
    # takes the lane's batches again.
    engine = LaneSpy(lane_delay_s=0.3)
    with serving(engine, "inproc://live-5", 100.0, 3, live_lane=True) as (
        router,
        identity,
        server,
    ):
        assert engine.lane is not None
        engine.lane.delay_s = 0.0  # the lane is quick again
        for batch_id in (1, 2, 3):
            router.send_multipart([identity, *encode(assign(batch_id))])
            assert isinstance(next_reply(router), BatchResult)
    threads = [thread for _, thread, _ in engine.log[2:]]
    assert threads == ["live-lane", "broker-link", "broker-link"] and server.stats.live == 3


def test_a_live_lane_needs_two_credits() -> None:
    ctx = zmq.Context()
    try:
        info = ModelInfo("m", [], DIMS, 4096, 1000, "mean", False, "0" * 64)
        options = WorkerOptions("w", 1, 4096, 64, "cpu", live_lane=True)
        with pytest.raises(ValueError, match="two credits"):
            WorkerServer(ctx, LaneSpy(), info, b"{}", "inproc://x", options, Liveness())
    finally:
        ctx.destroy(linger=0)


class _SlowCount(LoopStats):
    """Reading the batch count lets another thread run, as a GIL switch between a read and
    its write may."""

    @property  # type: ignore[override]
    def batches(self) -> int:
        n = self._n
        time.sleep(0.05)  # the other thread reads meanwhile
        return n

    @batches.setter
    def batches(self, n: int) -> None:
        self._n = n


def test_the_link_thread_and_the_finisher_answering_at_once_count_both_batches() -> None:
    ctx = zmq.Context()
    try:
        info = ModelInfo("m", [], DIMS, 4096, 1000, "mean", False, "0" * 64)
        options = WorkerOptions("w", 3, 4096, 64, "cpu")
        server = WorkerServer(ctx, SumEngine(), info, b"{}", "inproc://x", options, Liveness())
        server.stats = _SlowCount()
        server._outstanding = 2  # a live batch on the link thread, a bulk one in the finisher
        threads = [threading.Thread(target=server._answered) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert server.stats.batches == server.link.progress == 2
        assert server._outstanding == 0 and not server.link.busy
    finally:
        ctx.destroy(linger=0)


def test_a_lane_that_cannot_be_entered_answers_a_retryable_error_and_frees_the_worker() -> None:
    import contextlib

    from proto_msgs import BatchError, ErrorCode

    @contextlib.contextmanager
    def broken():  # e.g. the device gone when the stream is made current
        raise RuntimeError("CUDA error: device unavailable")
        yield

    engine = LaneSpy()
    with serving(engine, "inproc://live-9", ANY_TIME_MS, 3, live_lane=True) as (
        router,
        identity,
        server,
    ):
        server.live.running = broken  # type: ignore[union-attr, method-assign]
        router.send_multipart([identity, *encode(assign(1))])
        reply = next_reply(router)
        assert isinstance(reply, BatchError) and reply.batch_id == 1
        assert reply.code == ErrorCode.INTERNAL and reply.retryable
        server.live.running = contextlib.nullcontext  # type: ignore[union-attr, method-assign]
        router.send_multipart([identity, *encode(assign(2))])
        assert isinstance(next_reply(router), BatchResult)  # nothing was left held
    assert server.stats.batches == 2 and not server.link.busy


def test_lane_batches_too_slow_for_the_link_thread_run_on_the_lanes_own_thread() -> None:
    # A large model's query (50 ms here, over the inline bound; its warm-up timed it) must not
    # block the link thread, nor wait behind the bulk the compute thread holds: the lane's
    # own thread runs it.
    engine = LaneSpy(delay_s=30.0, lane_delay_s=0.05)  # bulk ends when the queries are answered
    replies, server = _queries_past_held_bulk(engine, "inproc://live-10", 10.0, (2, 3))
    assert [r.batch_id for r in replies] == [2, 3, 1]  # the queries did not wait for bulk
    ran = [(role, thread) for role, thread, _ in engine.log[2:]]
    assert ran[1:] == [(f"live<={INLINE_MAX_TOKENS}", "live-lane")] * 2
    assert server.stats.live == 2


def test_with_the_inline_path_off_the_lane_runs_nothing() -> None:
    engine = LaneSpy()
    with serving(engine, "inproc://live-11", 0.0, 3, live_lane=True) as (router, identity, server):
        router.send_multipart([identity, *encode(assign(1))])
        assert isinstance(next_reply(router), BatchResult)
    assert "broker-link" not in [thread for _, thread, _ in engine.log[2:]]
    assert server.stats.live == 0


def test_the_lane_thread_drops_a_batch_of_a_session_the_link_left() -> None:
    # As the compute loop does: after a reconnect the broker took the batch back (and may
    # send it here again), and its reply would be dropped; computing it only delays the new
    # session's queries and counts progress no reply carries.
    from mesh.worker.link import Incoming

    ctx = zmq.Context()
    try:
        engine = LaneSpy()
        info = ModelInfo("m", [], DIMS, 4096, 1000, "mean", False, "0" * 64)
        options = WorkerOptions("w", 3, 4096, 64, "cpu", inline_max_ms=ANY_TIME_MS, live_lane=True)
        server = WorkerServer(ctx, engine, info, b"{}", "inproc://x", options, Liveness())
        assert server._lane_queue is not None
        server._outstanding = 1  # accepted on epoch 0, as _accept counts it
        server.link.busy = True
        server.link.epoch = 1  # the link reconnected since
        server._lane_queue.put(Incoming(epoch=0, batch=assign(1), received_at=time.perf_counter()))
        server._lane_queue.put(None)
        server._lane_loop()  # returns at the None
        assert engine.log[2:] == []  # after the warm-up: nothing ran
        assert server._outstanding == 0 and not server.link.busy
        assert server.stats.batches == 0 and server.stats.live == 0
    finally:
        ctx.destroy(linger=0)


def test_a_slow_lane_never_runs_on_the_link_thread_however_long_it_was_quiet() -> None:
    # The lane's own thread times every batch it runs, so nothing needs the link thread to
    # time a slow lane again: a query after a quiet spell (over a second, once LIVE_RETRY_S)
    # ran there, blocking the link (its reads, the finisher's bulk replies) for its 50 ms.
    engine = LaneSpy(lane_delay_s=0.05)  # over the 10 ms bound; its warm-up timed it
    with serving(engine, "inproc://live-12", 10.0, 3, live_lane=True) as (
        router,
        identity,
        server,
    ):
        time.sleep(1.2)  # quiet since the warm-up
        router.send_multipart([identity, *encode(assign(1))])
        assert isinstance(next_reply(router), BatchResult)
    ran = [(role, thread) for role, thread, _ in engine.log[2:]]
    assert ran == [(f"live<={INLINE_MAX_TOKENS}", "live-lane")]
    assert server.stats.live == 1

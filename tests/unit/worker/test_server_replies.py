"""WorkerServer against a ROUTER standing in for the broker: every batch gets exactly one
reply (in order through the compute thread), and a reply that cannot be built becomes a retryable BatchError instead of
ending the finisher thread (which would silence the worker for good); replies carry the
worker's hop timings; an idle worker answers a small, quick batch on its link thread and
sends everything else through the compute thread."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import torch
import zmq

from mesh.worker.server import INLINE_MAX_TOKENS
from proto_msgs import BatchAssign, BatchError, BatchResult, Disconnect, ErrorCode, encode
from tests.unit.worker.worker_fakes import DIMS, SumEngine, assign, next_reply, serving


@pytest.mark.parametrize("inline_max_ms", [0.0, 10.0])
def test_every_batch_gets_one_reply_even_when_building_one_fails(inline_max_ms: float) -> None:
    endpoint = f"inproc://fake-broker-{inline_max_ms}"
    with serving(SumEngine(), endpoint, inline_max_ms) as (router, identity, server):
        real_collect = server.pipeline.collect

        def collect(launched, spin_s=0.0):  # batch 2's results: a dtype the wire refuses
            groups, ms = real_collect(launched, spin_s)
            if launched.batch_id == 2:
                groups = [g.astype(np.complex64) for g in groups]
            return groups, ms

        server.pipeline.collect = collect  # type: ignore[method-assign]
        for batch_id in (1, 2, 3):
            router.send_multipart([identity, *encode(assign(batch_id))])
        replies = [next_reply(router) for _ in range(3)]
    # One reply each; their order is not a contract: once batch 1 is answered, batches 2 and
    # 3 may run inline on the link thread and be sent before it forwards batch 1's reply.
    replies.sort(key=lambda r: r.batch_id)
    assert [r.batch_id for r in replies] == [1, 2, 3]
    ok1, failed, ok3 = replies
    assert isinstance(ok1, BatchResult) and isinstance(ok3, BatchResult)
    assert isinstance(failed, BatchError) and failed.code == ErrorCode.INTERNAL
    assert failed.retryable
    want = np.array([[3.0], [3.0 + 3]]) * np.arange(1, DIMS + 1)
    np.testing.assert_allclose(ok3.embeddings[0], want)
    # Counted after each send, so only certain once the loop has stopped.
    assert server.stats.batches == 3 and server.link.progress == 3
    assert not server.link.busy


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
        router.send_multipart([identity, *encode(assign(7))])
        assert engine.started.wait(10)
        server.stop()  # while batch 7 is still computing
        reply = next_reply(router)
        assert isinstance(reply, BatchResult) and reply.batch_id == 7
        assert isinstance(next_reply(router), Disconnect)


def test_a_reply_carries_the_workers_hop_timings() -> None:
    delay_s = 0.05
    with serving(SleepyEngine(delay_s), "inproc://fake-broker-3") as (router, identity, _):
        router.send_multipart([identity, *encode(assign(1))])
        reply = next_reply(router)
    assert isinstance(reply, BatchResult)
    assert set(reply.timings) == {"worker_wait", "worker_compute", "worker_reply"}
    assert all(math.isfinite(v) and v >= 0 for v in reply.timings.values())
    # The compute stamps bracket the engine call: its sleep is a floor, not a timing target.
    assert reply.timings["worker_compute"] >= delay_s * 1000


class ThreadSpy(SumEngine):
    """Records which thread ran each batch."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.threads: list[str] = []

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay_s)
        return super().embed(ids, offsets)


def _answer_one_at_a_time(router: zmq.Socket, identity: bytes, batches: list[BatchAssign]):
    replies = []
    for b in batches:  # one at a time: the worker is idle whenever the next one arrives
        router.send_multipart([identity, *encode(b)])
        replies.append(next_reply(router))
    return replies


# A bound no measured batch can pass, so that which thread runs a batch never depends on how
# busy the test machine is (a loaded CI host once took over 10 ms for the first one).
ANY_TIME_MS = 60_000.0


def test_an_idle_worker_answers_small_quick_batches_on_its_link_thread() -> None:
    engine = ThreadSpy()
    with serving(engine, "inproc://fake-broker-4", ANY_TIME_MS) as (router, identity, server):
        replies = _answer_one_at_a_time(router, identity, [assign(i) for i in (1, 2, 3)])
    assert [r.batch_id for r in replies] == [1, 2, 3]
    assert all(isinstance(r, BatchResult) for r in replies)
    # The first has no compute time to go by (a cold start can be slow): compute thread.
    assert engine.threads[0] != "broker-link"
    assert engine.threads[1:] == ["broker-link", "broker-link"]
    assert server.stats.batches == 3 and not server.link.busy


@pytest.mark.parametrize(
    ("why", "delay_s", "tokens", "inline_max_ms"),
    [
        ("over the size of a live query", 0.0, INLINE_MAX_TOKENS + 1, 10.0),
        ("batches that size took too long lately", 0.03, 4, 10.0),
        ("the inline path is off", 0.0, 4, 0.0),
    ],
)
def test_other_batches_go_through_the_compute_thread(
    why: str, delay_s: float, tokens: int, inline_max_ms: float
) -> None:
    engine = ThreadSpy(delay_s)
    endpoint = f"inproc://fake-broker-5-{len(why)}"
    with serving(engine, endpoint, inline_max_ms) as (router, identity, _):
        batches = [assign(i, tokens) for i in (1, 2, 3)]
        replies = _answer_one_at_a_time(router, identity, batches)
    assert [r.batch_id for r in replies] == [1, 2, 3], why
    assert all(isinstance(r, BatchResult) for r in replies), why
    assert len(engine.threads) == 3 and "broker-link" not in engine.threads, why


def test_batches_queued_behind_a_busy_worker_and_inline_ones_are_all_answered() -> None:
    engine = ThreadSpy(delay_s=0.002)
    with serving(engine, "inproc://fake-broker-6", ANY_TIME_MS) as (router, identity, server):
        _answer_one_at_a_time(router, identity, [assign(1)])  # gives a compute estimate
        # A big batch keeps the compute thread busy; the small ones behind it are queued.
        batches = [assign(2, INLINE_MAX_TOKENS + 1)] + [assign(b) for b in range(3, 12)]
        for b in batches:
            router.send_multipart([identity, *encode(b)])
        replies = [next_reply(router) for _ in batches]
        replies += _answer_one_at_a_time(router, identity, [assign(12)])  # idle again
    assert sorted(r.batch_id for r in replies) == list(range(2, 13))
    for r in replies:
        assert isinstance(r, BatchResult)
        if r.batch_id != 2:
            np.testing.assert_allclose(
                r.embeddings[0][1], (3.0 + r.batch_id) * np.arange(1, DIMS + 1)
            )
    assert engine.threads[-1] == "broker-link" and engine.threads[1] != "broker-link"
    assert server.stats.batches == 12 and not server.link.busy

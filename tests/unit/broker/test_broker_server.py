"""The broker loop on fake sockets: dispatch, timings, hostile peers, liveness, the catalog."""

from __future__ import annotations

from proto_msgs import BatchAssign, RequestResult
from tests.unit.broker.fakes import Harness, answer, ready, submit


def test_a_live_query_waits_behind_one_held_batch_not_two():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=2, max_batch_tokens=64))
    h.submit(submit(1, [16] * 16, lane=1))  # 256 bulk tokens: four full batches
    first, second = (m for _, m in h.back.take(BatchAssign))  # not live: both credits
    h.submit(submit(100, [4], lane=0, token=7))  # a query; no credit is free
    assert h.back.take(BatchAssign) == []
    h.back.push(b"w1", answer(first))
    h.pump()
    # The freed credit carries the query alone: the worker already holds a batch of bulk.
    [(_, live)] = h.back.take(BatchAssign)
    assert live.n == 1 and set(live.token_ids.tolist()) == {7}
    h.back.push(b"w1", answer(live))
    h.pump()
    # Live traffic was just seen and the worker still holds a batch of bulk: the credit waits.
    assert h.back.take(BatchAssign) == []
    h.back.push(b"w1", answer(second))
    h.pump()
    [(_, bulk)] = h.back.take(BatchAssign)
    assert bulk.n == 4 and set(bulk.token_ids.tolist()) == {5}
    chunks = [(m.cid, len(m.indices)) for _, m in h.front.take(RequestResult)]
    assert chunks == [(1, 4), (100, 1), (1, 4)]


def test_each_result_chunk_carries_the_workers_timings_and_the_brokers_hops():
    h = Harness()
    h.add_worker()
    h.submit(submit(1, [3]))
    [(_, batch)] = h.back.take(BatchAssign)
    result = answer(batch)
    result.timings = {"worker_compute": 2.5, "worker_reply": 0.25}
    h.back.push(b"w1", result)
    h.pump()
    [(_, chunk)] = h.front.take(RequestResult)
    hops = {"broker_queue", "broker_worker", "broker_out"}
    assert set(chunk.timings) == {"worker_compute", "worker_reply"} | hops
    assert chunk.timings["worker_compute"] == 2.5
    assert all(chunk.timings[name] >= 0.0 for name in hops)
    assert chunk.compute_ms == 1.0


def test_a_worker_that_names_too_many_timings_gets_none_forwarded():
    h = Harness()
    h.add_worker()
    h.submit(submit(1, [3]))
    [(_, batch)] = h.back.take(BatchAssign)
    result = answer(batch)
    result.timings = {f"t{i}": 1.0 for i in range(1000)}
    h.back.push(b"w1", result)
    h.pump()
    [(_, chunk)] = h.front.take(RequestResult)
    assert set(chunk.timings) == {"broker_queue", "broker_worker", "broker_out"}

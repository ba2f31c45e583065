"""What the broker tells of itself on every Pong: lanes, batches, waits and workers."""

from __future__ import annotations

from mesh.broker.stats import DOWN_FORGET_S, DOWN_KEEP
from proto_msgs import BatchAssign, Lane, Ping, Pong, decode, encode
from proto_msgs.stats import WAIT_BUCKETS_S
from tests.unit.broker.fakes import INGRESS, MODEL, Harness, answer, ready, submit


def _pong(h: Harness) -> Pong:
    """The stats as an ingress gets them: asked with a Ping, through the codec."""
    h.front.push(INGRESS, Ping(cid=99))
    h.pump()
    [(_, pong)] = h.front.take(Pong)
    return decode(encode(pong))


def test_queued_work_shows_by_lane_and_in_seconds_once_the_rate_is_known():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=1, max_batch_tokens=64))
    h.submit(submit(1, [16] * 8, lane=Lane.BATCH))  # 128 tokens: one batch out, 64 wait
    h.submit(submit(2, [4, 4], lane=Lane.INTERACTIVE))
    model = _pong(h).stats.models[MODEL]
    interactive, batch = model.lanes
    assert (interactive.queued_sequences, interactive.queued_tokens) == (2, 8)
    assert (batch.queued_sequences, batch.queued_tokens) == (4, 64)
    assert model.queued_s == 0.0  # no large batch has run yet: the rate is unknown
    h.broker.registry.workers[b"w1"].rate = 36.0  # tokens/s, as a large batch would teach it
    assert _pong(h).stats.models[MODEL].queued_s == (8 + 64) / 36.0


def test_work_done_is_counted_by_lane_when_its_batch_returns():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=1, max_batch_tokens=64))
    h.submit(submit(1, [16] * 2, lane=Lane.BATCH))
    h.submit(submit(2, [4], lane=Lane.INTERACTIVE))
    [(identity, first)] = h.back.take(BatchAssign)  # the bulk request: nothing live waited yet
    before = _pong(h).stats.models[MODEL]
    assert [lane.tokens_done for lane in before.lanes] == [0, 0]
    h.back.push(identity, answer(first))
    h.pump()
    [(identity, second)] = h.back.take(BatchAssign)
    h.back.push(identity, answer(second))
    h.pump()
    stats = _pong(h).stats
    interactive, batch = stats.models[MODEL].lanes
    assert (interactive.sequences_done, interactive.tokens_done) == (1, 4)
    assert (batch.sequences_done, batch.tokens_done) == (2, 32)
    [worker] = stats.worker_list
    assert (worker.batches_done, worker.tokens_done, worker.state) == (2, 36, "up")


def test_batch_fill_counts_the_tokens_and_the_budgets_of_the_batches_sent():
    h = Harness(aging_s=60.0, cpu_bulk_ms=0.0)  # batches cut by the budget alone
    h.add_worker(msg=ready(credits=2, max_batch_tokens=64))
    h.submit(submit(1, [16] * 5, lane=Lane.BATCH))  # 80 tokens: a full batch and a fifth
    model = _pong(h).stats.models[MODEL]
    assert (model.batches, model.batch_tokens, model.batch_budget_tokens) == (2, 80, 128)


def test_each_part_s_queue_wait_lands_in_its_lane_s_histogram():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=1, max_batch_tokens=64))
    h.submit(submit(1, [16] * 4, lane=Lane.BATCH))  # dispatched at once: waited 0 s
    h.submit(submit(2, [4], lane=Lane.INTERACTIVE))  # waits for the credit
    [(identity, first)] = h.back.take(BatchAssign)
    h.now = 0.3
    h.back.push(identity, answer(first))
    h.pump()
    interactive, batch = _pong(h).stats.models[MODEL].lanes
    assert sum(batch.wait_counts) == 1 and batch.wait_counts[0] == 1 and batch.wait_sum_s == 0
    assert sum(interactive.wait_counts) == 1 and interactive.wait_sum_s == 0.3
    assert interactive.wait_counts[WAIT_BUCKETS_S.index(0.5)] == 1  # 0.25 < 0.3 <= 0.5


def test_a_worker_is_busy_while_it_holds_a_batch_and_down_after_it_is_buried():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(name="gpu-host:cuda:0", credits=2, device="cuda:0"))
    h.submit(submit(1, [16], lane=Lane.BATCH))
    [worker] = _pong(h).stats.worker_list
    assert (worker.id, worker.name, worker.model, worker.device) == (
        b"w1".hex(),
        "gpu-host:cuda:0",
        MODEL,
        "cuda:0",
    )
    assert (worker.state, worker.inflight_batches, worker.credits) == ("busy", 1, 2)
    h.now = 10.0
    h.broker._tick(h.now)  # silent past its liveness: buried
    [gone] = _pong(h).stats.worker_list
    assert gone.state == "down" and "silent" in gone.reason and gone.inflight_batches == 0
    h.add_worker(b"w2", ready(name="gpu-host:cuda:0"))  # the same worker, restarted
    # It replaces the down entry, and takes the requeued batch at once.
    assert [(w.id, w.state) for w in _pong(h).stats.worker_list] == [(b"w2".hex(), "busy")]


def test_down_workers_are_bounded_in_number_and_in_time():
    h = Harness()
    for i in range(DOWN_KEEP + 5):
        identity = f"w{i}".encode()
        h.add_worker(identity, ready(name=f"host-{i}:cpu"))
        h.broker._bury(identity, "test", h.now, tell=False)
    listed = _pong(h).stats.worker_list
    assert len(listed) == DOWN_KEEP and listed[-1].name == f"host-{DOWN_KEEP + 4}:cpu"
    h.now = DOWN_FORGET_S + 1
    assert _pong(h).stats.worker_list == []

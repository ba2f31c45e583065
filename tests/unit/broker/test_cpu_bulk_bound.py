"""A CPU worker's bulk is bounded in time whether or not queries came lately: the batches the
broker hands it on the batch lane hold at most ``cpu_bulk_ms`` of its compute (at the rate it
announced in READY, then the one its batches teach), and one credit stays free, so that a lone
query after a quiet spell is dispatched at once and waits behind one short batch."""

from __future__ import annotations

import pytest
from fakes import Harness, answer, ready, submit

from proto_msgs import BatchAssign, BatchResult, RequestResult

# A worker of 1024-token batches computing 1024 tokens a second: 100 ms of it is 102 tokens.
SLOW = dict(credits=2, max_batch_tokens=1024, max_batch_requests=512, tokens_per_s=1024.0)
CAP = 1024 * 100 // 1000


def at_rate(batch: BatchAssign, tokens_per_s: float = 1024.0) -> BatchResult:
    """``batch``'s result, computed at ``tokens_per_s``."""
    result = answer(batch)
    result.compute_ms = len(batch.token_ids) / tokens_per_s * 1000
    return result


def bulk_batches(h: Harness) -> list[int]:
    return [m.n * 16 for _, m in h.back.take(BatchAssign)]


def test_a_cpu_workers_bulk_batches_respect_the_bound_without_live_traffic() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0, live_window_s=1.0)
    h.add_worker(msg=ready(device="cpu", **SLOW))
    h.now = 50.0  # no query ever: the model is not live
    h.submit(submit(1, [16] * 128, lane=1))  # 2048 bulk tokens
    # One batch within ~100 ms of compute (a head longer than what is left still goes: one
    # sequence over at most); the second credit stays free for a query.
    [first] = bulk_batches(h)
    assert first <= CAP + 16
    assert h.broker.inflight.bulk_tokens(b"w1") == first
    [worker] = h.broker.registry.workers.values()
    assert worker.free == 1


def test_a_lone_query_after_a_quiet_spell_goes_at_once_behind_one_short_batch() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0, live_window_s=1.0)
    h.add_worker(msg=ready(device="cpu", **SLOW))
    h.now = 50.0
    h.submit(submit(1, [16] * 128, lane=1))
    [(_, bulk)] = h.back.take(BatchAssign)
    h.now = 60.0  # long after any query
    h.submit(submit(100, [4], lane=0, token=7))
    # The free credit carries the query now, not after the bulk batch's reply.
    [(_, query)] = h.back.take(BatchAssign)
    assert query.n == 1 and set(query.token_ids.tolist()) == {7}
    # Order at the worker: the one short bulk batch, then the query; then bulk goes on, bounded.
    h.back.push(b"w1", at_rate(bulk))
    h.back.push(b"w1", at_rate(query))
    h.pump()
    chunks = [m.cid for _, m in h.front.take(RequestResult)]
    assert chunks == [1, 100]
    assert all(tokens <= CAP + 16 for tokens in bulk_batches(h))


def test_the_bound_follows_the_rate_the_batches_teach() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0)
    h.add_worker(msg=ready(device="cpu", **SLOW))
    h.now = 50.0
    h.submit(submit(1, [16] * 512, lane=1))
    sizes = []
    for _ in range(12):  # each batch answered at 1.5 times the announced rate
        [(_, batch)] = h.back.take(BatchAssign)
        sizes.append(batch.n * 16)
        faster = answer(batch)
        faster.compute_ms = batch.n * 16 / 1536 * 1000  # a CPU's bulk teaches, small or not
        h.back.push(b"w1", faster)
        h.pump()
    [worker] = h.broker.registry.workers.values()
    assert worker.rate == pytest.approx(1536.0)  # the first batch's, higher than announced
    assert sizes[0] <= CAP + 16 < sizes[-1] <= int(worker.rate * 0.1) + 16


def test_a_gpu_worker_without_live_traffic_gets_full_batches_on_every_credit() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0)
    h.add_worker(msg=ready(device="cuda:0", **SLOW))
    h.now = 50.0
    h.submit(submit(1, [16] * 256, lane=1))
    assert bulk_batches(h) == [1024, 1024]


def test_the_bound_off_leaves_a_quiet_cpu_worker_full_batches() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=0.0)
    h.add_worker(msg=ready(device="cpu", **SLOW))
    h.now = 50.0
    h.submit(submit(1, [16] * 256, lane=1))
    assert bulk_batches(h) == [1024, 1024]


def test_a_cpu_worker_of_unknown_rate_starts_with_its_budget() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0)
    h.add_worker(msg=ready(device="cpu", **{**SLOW, "tokens_per_s": 0.0}))
    h.now = 50.0
    h.submit(submit(1, [16] * 256, lane=1))
    # Capped at one budget (live_bulk_batches) with a credit free until a rate is known.
    assert bulk_batches(h) == [1024]


def test_an_announced_rate_far_too_low_is_replaced_by_the_first_bulk_batch() -> None:
    # Measured at start beside a busy host: 100 tokens/s would keep every batch one sequence.
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0)
    h.add_worker(msg=ready(device="cpu", **{**SLOW, "tokens_per_s": 100.0}))
    h.now = 50.0
    h.submit(submit(1, [16] * 512, lane=1))
    [(_, first)] = h.back.take(BatchAssign)
    assert first.n == 1  # 10 tokens of compute: the head alone
    real = answer(first)
    real.compute_ms = 16 / 5000 * 1000  # 5,000 tokens a second
    h.back.push(b"w1", real)
    h.pump()
    [worker] = h.broker.registry.workers.values()
    assert worker.rate == pytest.approx(5000.0)
    assert bulk_batches(h) == [496]  # ~500 tokens: 100 ms at the real rate


def test_a_query_does_not_teach_a_cpu_workers_rate() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=100.0)
    h.add_worker(msg=ready(device="cpu", **SLOW))
    h.submit(submit(100, [16], lane=0))  # a query: fixed cost, not a rate
    [(_, query)] = h.back.take(BatchAssign)
    slow = answer(query)
    slow.compute_ms = 200.0
    h.back.push(b"w1", slow)
    h.pump()
    [worker] = h.broker.registry.workers.values()
    assert worker.rate == 1024.0 and worker.rate_announced


def test_while_live_a_cpu_worker_keeps_its_own_bound() -> None:
    h = Harness(aging_s=60.0, cpu_bulk_ms=300.0, live_bulk_ms=50.0)
    h.add_worker(msg=ready(device="cpu", **SLOW))
    h.make_live()
    h.submit(submit(1, [16] * 128, lane=1))
    # 300 ms of 1,024 tokens a second, not live_bulk_ms's 50.
    [held] = bulk_batches(h)
    assert 1024 * 50 // 1000 + 16 < held <= 1024 * 300 // 1000 + 16

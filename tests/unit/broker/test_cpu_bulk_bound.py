"""A CPU worker's bulk is bounded in time whether or not queries came lately: the batches the
broker hands it on the batch lane hold at most ``cpu_bulk_ms`` of its compute (at the rate it
announced in READY, then the one its batches teach), and one credit stays free, so that a lone
query after a quiet spell is dispatched at once and waits behind one short batch."""

from __future__ import annotations

from fakes import Harness, answer, ready, submit

from proto_msgs import BatchAssign, RequestResult

# A worker of 1024-token batches computing 1024 tokens a second: 100 ms of it is 102 tokens.
SLOW = dict(credits=2, max_batch_tokens=1024, max_batch_requests=512, tokens_per_s=1024.0)
CAP = 1024 * 100 // 1000


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
    h.back.push(b"w1", answer(bulk))
    h.back.push(b"w1", answer(query))
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
        faster.compute_ms = batch.n * 16 / 1536 * 1000  # over RATE_MIN_CPU_MS: it teaches
        h.back.push(b"w1", faster)
        h.pump()
    [worker] = h.broker.registry.workers.values()
    assert 1024.0 < worker.rate <= 1536.0  # a moving average toward 1536
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

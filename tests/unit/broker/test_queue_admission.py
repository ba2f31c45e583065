"""Admission measured in time: the queue refuses what its workers cannot finish in time."""

from __future__ import annotations

import pytest

from mesh.broker.queue import LONE_SLACK, Lane, Overloaded, Queue
from mesh.broker.registry import Registry
from mesh.broker.requests import Request
from tests.unit.broker import fakes

BIG = 10**9


def test_a_request_whose_wait_passes_its_deadline_is_refused_with_the_excess_as_retry_after(
    make_request,
):
    queue = Queue(BIG)
    queue.submit(make_request([1000], lane=Lane.BATCH, deadline=10.0), now=0.0, drain_rate=100.0)
    # 1000 tokens ahead + 500 of its own at 100 tok/s = 15 s, its deadline is 10 s away.
    with pytest.raises(Overloaded) as raised:
        queue.submit(make_request([500], lane=Lane.BATCH, deadline=10.0), 0.0, drain_rate=100.0)
    assert raised.value.retry_after_s == pytest.approx(5.0)
    # The same request with a longer deadline fits.
    queue.submit(make_request([500], lane=Lane.BATCH, deadline=20.0), 0.0, drain_rate=100.0)
    assert queue.queued_tokens("m") == 1500


def test_a_request_alone_in_its_lane_gets_the_benefit_of_the_doubt_up_to_the_slack():
    queue = Queue(BIG)
    # 14 s of work for a 10 s deadline, nothing ahead: the rate is an estimate, its chance.
    request = _request(lengths=[1400], lane=Lane.BATCH, deadline=10.0)
    queue.submit(request, now=0.0, drain_rate=100.0)
    assert queue.queued_tokens("m") == 1400
    assert 10.0 < 1400 / 100.0 <= 10.0 * LONE_SLACK  # over its deadline, within the slack


def test_a_request_alone_that_could_never_end_in_time_is_refused_up_front():
    queue = Queue(BIG)
    lone = _request(lengths=[10_000], lane=Lane.BATCH, deadline=1.0)  # 10 000 s of work
    with pytest.raises(Overloaded) as exc:
        queue.submit(lone, now=0.0, drain_rate=1.0)
    assert exc.value.retry_after_s > 0
    assert queue.queued_tokens("m") == 0


def test_an_interactive_request_waits_only_behind_interactive_work(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([5000], lane=Lane.BATCH), now=0.0, drain_rate=100.0)
    # 50 s of bulk queued; a query with a 1 s deadline is still admitted: it goes first.
    queue.submit(make_request([10], deadline=1.0), now=0.0, drain_rate=100.0)
    # Behind that query's 10 tokens, a second query of 100 tokens needs 1.1 s: refused.
    with pytest.raises(Overloaded):
        queue.submit(make_request([100], deadline=1.0), now=0.0, drain_rate=100.0)
    assert queue.backlog_s("m", 100.0) == pytest.approx((0.1, 50.1))


def test_without_a_deadline_the_queue_s_own_wait_bound_applies(make_request):
    queue = Queue(BIG, max_wait_s=2.0)
    queue.submit(make_request([100], lane=Lane.BATCH), now=0.0, drain_rate=100.0)
    queue.submit(make_request([100], lane=Lane.BATCH), now=0.0, drain_rate=100.0)  # 2 s: fits
    with pytest.raises(Overloaded):
        queue.submit(make_request([1], lane=Lane.BATCH), now=0.0, drain_rate=100.0)


def test_an_unknown_rate_leaves_only_the_token_cap(make_request):
    queue = Queue(BIG)
    for _ in range(3):
        queue.submit(make_request([10**6], lane=Lane.BATCH, deadline=0.001), 0.0, drain_rate=0.0)
    assert queue.backlog_s("m", 0.0) == (0.0, 0.0)


def test_the_drain_rate_is_the_sum_of_the_model_s_workers_learned_rates():
    registry = Registry()
    a = registry.add(b"a", fakes.ready(fakes.card("m")), now=0.0, liveness=3)
    b = registry.add(b"b", fakes.ready(fakes.card("m")), now=0.0, liveness=3)
    registry.add(b"c", fakes.ready(fakes.card("other")), now=0.0, liveness=3)
    assert registry.drain_rate("m") == 0.0
    a.note_compute(4096, 1000.0)  # 4096 tok/s
    b.note_compute(8192, 1000.0)
    assert registry.drain_rate("m") == pytest.approx(4096 + 8192)
    assert registry.drain_rate("other") == 0.0


def test_a_fresh_worker_counts_with_its_measured_rate_until_it_has_a_learned_one():
    registry = Registry()
    probed = fakes.ready(fakes.card("m"))
    probed.tokens_per_s = 1000.0  # the probe batch's (or the auto sweep's) rate
    a = registry.add(b"a", probed, now=0.0, liveness=3)
    registry.add(b"b", fakes.ready(fakes.card("m")), now=0.0, liveness=3)  # no probe: 0
    assert registry.drain_rate("m") == pytest.approx(1000.0)
    a.note_compute(4096, 1000.0)  # served batches replace the probe's estimate
    assert registry.drain_rate("m") == pytest.approx(4096.0)


def _request(lengths, lane, deadline):
    from mesh.broker.requests import Request

    return Request((b"i", 1), "m", lane, lengths, deadline, 0.0)


def test_the_broker_refuses_in_time_once_it_knows_its_worker_s_rate_and_says_so_on_pong():
    from proto_msgs import BatchAssign, ErrorCode, Ping, Pong, RequestError

    h = fakes.Harness()
    h.add_worker()  # budget 64 tokens, 1 credit
    # Teach the broker the worker's rate: a 32-token batch computed in 1000 ms = 32 tok/s.
    h.submit(fakes.submit(1, [16, 16]))
    [(_, batch)] = h.back.take(BatchAssign)
    result = fakes.answer(batch)
    result.compute_ms = 1000.0
    h.back.push(b"w1", result)
    h.pump()
    # 10 sequences of 16 tokens: 160 tokens, 5 s at 32 tok/s; each with a 4 s deadline.
    for cid in range(2, 12):
        msg = fakes.submit(cid, [16], lane=1)
        msg.timeout_ms = 4000
        h.submit(msg)
    refused = [m for _, m in h.front.take(RequestError) if m.code == ErrorCode.OVERLOADED]
    assert refused, "work past its deadline at the learned rate must be refused at admission"
    assert all(m.retry_after_ms and m.retry_after_ms > 0 for m in refused)
    h.front.push(fakes.INGRESS, Ping(cid=99))
    h.pump()
    [(_, pong)] = h.front.take(Pong)
    interactive_s, batch_s = pong.stats.backlog_s[fakes.MODEL]
    assert interactive_s == 0.0 and 0.0 < batch_s <= 4.0


def test_a_cold_first_batch_or_a_few_queries_do_not_sink_the_rate_admission_runs_on():
    # A CPU worker on a busy host: the sweep chose 256 tokens at 2,900 tok/s; its first batch
    # ran cold and its queries are mostly fixed cost. Taken as its rate, either made a 14k-token
    # request look like minutes of work and refused it, where the worker takes seconds.
    registry = Registry()
    announced = fakes.ready(fakes.card("m"), max_batch_tokens=256)
    announced.tokens_per_s = 2900.0
    worker = registry.add(b"a", announced, now=0.0, liveness=3)
    worker.note_compute(72, 500.0)  # four queries: under half the budget, no rate
    assert worker.rate == 2900.0
    worker.note_compute(200, 500.0)  # the first large batch, cold: 400 tok/s
    assert worker.rate == 2900.0
    queue = Queue(BIG)
    queue.submit(_request([72], Lane.INTERACTIVE, 120.0), 0.0, registry.drain_rate("m"))
    heavy = Request((b"i", 2), "m", Lane.INTERACTIVE, [18] * 800, 120.0, 0.0)
    queue.submit(heavy, 0.0, registry.drain_rate("m"))  # 14,472 tokens ahead and its own: 5 s
    # Later batches teach as any batch does: a slower one moves the rate a fifth of the way.
    worker.note_compute(256, 256.0)
    assert worker.rate == pytest.approx(0.8 * 2900 + 0.2 * 1000)


def test_any_batch_raises_a_known_rate_but_only_large_ones_set_or_lower_it():
    # Announced beside a busy start at 1,000 tok/s; the worker does 3,000 and gets only
    # 600-token batches (under the 1,024 a batch needs to teach): a batch's rate is at most
    # the worker's peak, so they raise it, and a long request is not refused as too long.
    registry = Registry()
    announced = fakes.ready(fakes.card("m"), max_batch_tokens=2048)
    announced.tokens_per_s = 1000.0
    worker = registry.add(b"a", announced, now=0.0, liveness=3)
    worker.note_compute(600, 200.0)
    assert worker.rate == pytest.approx(3000.0)
    queue = Queue(BIG)
    lone = Request((b"i", 3), "m", Lane.BATCH, [500] * 100, 30.0, 0.0)
    queue.submit(lone, 0.0, registry.drain_rate("m"))  # 50k tokens: 17 s at 3,000, not 50
    worker.note_compute(600, 400.0)  # a slower small batch does not lower it
    assert worker.rate == pytest.approx(3000.0)
    unknown = registry.add(b"b", fakes.ready(fakes.card("n"), max_batch_tokens=2048), 0.0, 3)
    unknown.note_compute(72, 500.0)  # queries alone never make a rate up
    assert unknown.rate == 0.0

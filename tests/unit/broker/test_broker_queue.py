from __future__ import annotations

import numpy as np
import pytest

from mesh import errors
from mesh.broker.queue import (
    COMPACT_AFTER,
    RETRY_AFTER_DEFAULT_S,
    Lane,
    Overloaded,
    Queue,
    Request,
    RequestTooLarge,
    Slice,
)
from proto_msgs import ErrorCode

BIG = 10**9


def spans(batch) -> list[tuple[int, int, int]]:
    """(correlation id, start, end) of each slice, in batch order."""
    return [(piece.request.key[1], piece.start, piece.end) for piece in batch.slices]


def test_a_request_needs_sequences_of_at_least_one_token():
    for lengths in ([], [3, 0], [[1, 2]]):
        with pytest.raises(ValueError):
            Request((b"i", 1), "m", Lane.INTERACTIVE, np.array(lengths), None, 0.0)


def test_form_batch_returns_none_when_nothing_is_queued(make_request):
    queue = Queue(BIG)
    assert queue.form_batch("m", 100, 10, now=0.0) is None
    queue.submit(make_request([5]), now=0.0)
    assert queue.form_batch("m", 100, 10, now=0.0) is not None
    assert queue.form_batch("m", 100, 10, now=0.0) is None


def test_sequences_are_served_first_come_first_served_within_a_lane(make_request):
    queue = Queue(BIG)
    for lengths in ([1, 1], [1], [1, 1, 1]):
        queue.submit(make_request(lengths), now=0.0)
    batch = queue.form_batch("m", 100, 4, now=0.0)
    assert spans(batch) == [(1, 0, 2), (2, 0, 1), (3, 0, 1)]
    assert spans(queue.form_batch("m", 100, 4, now=0.0)) == [(3, 1, 3)]


def test_a_request_longer_than_the_budget_spans_several_batches(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([4] * 10), now=0.0)
    cuts = [spans(queue.form_batch("m", 13, 100, now=0.0)) for _ in range(4)]
    assert cuts == [[(1, 0, 3)], [(1, 3, 6)], [(1, 6, 9)], [(1, 9, 10)]]


def test_batch_stops_before_the_sequence_that_would_exceed_the_budget(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([6, 6]), now=0.0)
    queue.submit(make_request([1]), now=0.0)
    batch = queue.form_batch("m", 10, 100, now=0.0)
    # The 1-token request would fit, but it may not jump over the head of its lane.
    assert spans(batch) == [(1, 0, 1)]
    assert (batch.tokens, batch.sequences) == (6, 1)


def test_batch_stops_at_the_sequence_cap(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([1] * 5), now=0.0)
    queue.submit(make_request([1] * 5), now=0.0)
    assert spans(queue.form_batch("m", 100, 7, now=0.0)) == [(1, 0, 5), (2, 0, 2)]
    assert queue.queued_sequences("m") == 3


def test_interactive_work_goes_before_the_batch_lane(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([5], lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([5], lane=Lane.INTERACTIVE), now=0.0)
    assert spans(queue.form_batch("m", 100, 10, now=0.5)) == [(2, 0, 1), (1, 0, 1)]


def test_the_batch_lane_fills_the_budget_interactive_work_leaves(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([3, 3], lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([5, 9]), now=0.0)
    assert spans(queue.form_batch("m", 10, 10, now=0.0)) == [(2, 0, 1), (1, 0, 1)]


def test_an_aged_batch_lane_head_goes_before_interactive_work(make_request):
    queue = Queue(BIG, aging_s=1.0)
    queue.submit(make_request([2], lane=Lane.BATCH, at=0.0), now=0.0)
    queue.submit(make_request([2], at=0.9), now=0.9)
    assert spans(queue.form_batch("m", 100, 10, now=1.0)) == [(1, 0, 1), (2, 0, 1)]


def test_an_aged_batch_lane_takes_at_most_half_while_interactive_work_waits(make_request):
    queue = Queue(BIG, aging_s=1.0)
    queue.submit(make_request([1] * 100, lane=Lane.BATCH, at=0.0), now=0.0)
    queue.submit(make_request([1] * 3, at=5.0), now=5.0)
    batch = queue.form_batch("m", 10, 100, now=5.0)
    assert spans(batch) == [(1, 0, 5), (2, 0, 3), (1, 5, 7)]
    # With no interactive work waiting, the batch lane has the whole budget.
    assert spans(queue.form_batch("m", 10, 100, now=5.0)) == [(1, 7, 17)]


def test_an_aged_batch_head_longer_than_half_the_budget_still_goes_first(make_request):
    queue = Queue(BIG, aging_s=1.0)
    queue.submit(make_request([8], lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([1]), now=2.0)
    assert spans(queue.form_batch("m", 10, 10, now=2.0)) == [(1, 0, 1), (2, 0, 1)]


def test_a_head_longer_than_the_whole_budget_is_refused_instead_of_stalling(make_request):
    queue = Queue(BIG)
    big = make_request([3, 50, 3])
    queue.submit(big, now=0.0)
    queue.submit(make_request([4]), now=0.0)
    assert spans(queue.form_batch("m", 10, 10, now=0.0)) == [(1, 0, 1)]
    batch = queue.form_batch("m", 10, 10, now=0.0)
    assert batch.refused == [big]
    assert spans(batch) == [(2, 0, 1)]
    assert not big.live and queue.queued_tokens("m") == 0


def test_cancelled_requests_release_their_tokens_at_once_and_are_skipped(make_request):
    queue = Queue(BIG)
    first = make_request([2, 2])
    queue.submit(first, now=0.0)
    queue.submit(make_request([3]), now=0.0)
    assert queue.cancel(first.key)
    assert (queue.queued_tokens("m"), queue.queued_sequences("m"), queue.depth()) == (3, 1, 1)
    batch = queue.form_batch("m", 100, 10, now=0.0)
    assert spans(batch) == [(2, 0, 1)]
    assert batch.expired == [] and batch.refused == []


def test_cancel_of_an_unknown_or_ended_request_returns_false(make_request):
    queue = Queue(BIG)
    request = make_request([1])
    assert not queue.cancel(request.key)
    queue.submit(request, now=0.0)
    assert queue.cancel(request.key)
    assert not queue.cancel(request.key)


def test_expired_requests_are_reported_once_and_never_dispatched(make_request):
    queue = Queue(BIG)
    late = make_request([2, 2], deadline=1.0)
    queue.submit(late, now=0.0)
    queue.submit(make_request([3], deadline=5.0), now=0.0)
    batch = queue.form_batch("m", 100, 10, now=1.0)
    assert batch.expired == [late]
    assert spans(batch) == [(2, 0, 1)]
    assert queue.expire(now=2.0) == []
    assert queue.queued_tokens("m") == 0


def test_an_empty_batch_still_reports_what_expired(make_request):
    queue = Queue(BIG)
    late = make_request([2], deadline=1.0)
    queue.submit(late, now=0.0)
    batch = queue.form_batch("m", 100, 10, now=3.0)
    assert batch.slices == [] and batch.expired == [late]


def test_expire_ends_requests_whether_queued_or_in_flight(make_request):
    queue = Queue(BIG)
    in_flight = make_request([1, 1], deadline=2.0)
    queued = make_request([1], deadline=1.0, lane=Lane.BATCH)
    queue.submit(in_flight, now=0.0)
    queue.submit(queued, now=0.0)
    queue.submit(make_request([1]), now=0.0)
    queue.form_batch("m", 2, 10, now=0.0)
    assert queue.expire(now=0.5) == []
    assert queue.expire(now=2.0) == [queued, in_flight]
    assert queue.queued_tokens("m") == 1
    assert not queue.complete(in_flight, 2)


def test_submit_over_the_queued_token_bound_is_overloaded(make_request):
    queue = Queue(max_queued_tokens=10)
    queue.submit(make_request([4, 4]), now=0.0)
    with pytest.raises(Overloaded) as raised:
        queue.submit(make_request([3]), now=0.0)
    assert raised.value.retry_after_s == RETRY_AFTER_DEFAULT_S
    assert raised.value.code == ErrorCode.OVERLOADED
    assert isinstance(raised.value, errors.MeshError)
    queue.submit(make_request([2]), now=0.0)
    assert queue.queued_tokens("m") == 10


def test_retry_after_follows_the_measured_drain_rate(make_request):
    queue = Queue(max_queued_tokens=100)
    for step in range(3):
        queue.submit(make_request([50]), now=float(step))
        queue.form_batch("m", 100, 10, now=float(step))  # 50 tokens a second
    queue.submit(make_request([100]), now=3.0)
    with pytest.raises(Overloaded) as raised:
        queue.submit(make_request([25]), now=3.0)
    assert raised.value.retry_after_s == pytest.approx(0.5)


def test_a_request_larger_than_the_whole_bound_is_too_large(make_request):
    queue = Queue(max_queued_tokens=10)
    with pytest.raises(RequestTooLarge) as raised:
        queue.submit(make_request([6, 6]), now=0.0)
    assert raised.value.code == ErrorCode.TOO_LARGE


def test_a_duplicate_key_is_refused_while_live_and_reusable_after_it_ends(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([1], key=(b"i", 7)), now=0.0)
    with pytest.raises(ValueError):
        queue.submit(make_request([1], key=(b"i", 7)), now=0.0)
    assert queue.queued_sequences("m") == 1
    assert queue.cancel((b"i", 7))
    queue.submit(make_request([1], key=(b"i", 7)), now=0.0)


def test_requeued_slices_go_back_at_the_head_in_their_order(make_request):
    queue = Queue(BIG)
    for lengths in ([1, 1, 1], [1]):
        queue.submit(make_request(lengths), now=0.0)
    queue.submit(make_request([1], lane=Lane.BATCH), now=0.0)
    lost = queue.form_batch("m", 100, 3, now=0.0).slices
    queue.submit(make_request([1]), now=0.0)
    queue.requeue_front(lost)
    assert queue.queued_sequences("m") == 6
    batch = queue.form_batch("m", 100, 10, now=0.0)
    assert spans(batch) == [(1, 0, 3), (2, 0, 1), (4, 0, 1), (3, 0, 1)]
    assert [piece.attempt for piece in batch.slices] == [2, 1, 1, 1]


def test_requeue_drops_slices_of_ended_requests(make_request):
    queue = Queue(BIG)
    gone, kept = make_request([1, 1]), make_request([1])
    queue.submit(gone, now=0.0)
    queue.submit(kept, now=0.0)
    lost = queue.form_batch("m", 100, 10, now=0.0).slices
    queue.cancel(gone.key)
    queue.requeue_front(lost)
    assert queue.queued_sequences("m") == 1
    assert spans(queue.form_batch("m", 100, 10, now=0.0)) == [(2, 0, 1)]


def test_failing_a_request_drops_its_remaining_queued_sequences(make_request):
    queue = Queue(BIG)
    request = make_request([1] * 4)
    queue.submit(request, now=0.0)
    queue.form_batch("m", 2, 10, now=0.0)
    assert queue.fail_request(request)
    assert not queue.fail_request(request)
    assert queue.queued_sequences("m") == 0
    assert queue.form_batch("m", 100, 10, now=0.0) is None


def test_complete_is_true_once_when_the_last_sequence_is_done(make_request):
    queue = Queue(BIG)
    request = make_request([1] * 3)
    queue.submit(request, now=0.0)
    first = queue.form_batch("m", 2, 10, now=0.0).slices[0]
    second = queue.form_batch("m", 2, 10, now=0.0).slices[0]
    assert not queue.complete(request, first.end - first.start)
    assert request.key in queue.requests
    assert queue.complete(request, second.end - second.start)
    assert request.key not in queue.requests and len(queue.requests) == 0
    assert not queue.complete(request, 1)


def test_completing_more_sequences_than_are_in_flight_is_a_bug(make_request):
    queue = Queue(BIG)
    request = make_request([1] * 3)
    queue.submit(request, now=0.0)
    queue.form_batch("m", 1, 10, now=0.0)
    with pytest.raises(ValueError):
        queue.complete(request, 2)


def test_a_late_result_of_an_ended_request_never_counts_for_a_reused_key(make_request):
    queue = Queue(BIG)
    old = make_request([1], key=(b"i", 1))
    queue.submit(old, now=0.0)
    piece = queue.form_batch("m", 100, 10, now=0.0).slices[0]
    queue.cancel(old.key)
    new = make_request([1], key=(b"i", 1))
    queue.submit(new, now=0.0)
    assert not queue.complete(piece.request, 1)
    assert new.outstanding == 1 and queue.requests.get((b"i", 1)) is new


def test_models_are_queued_and_bounded_separately(make_request):
    queue = Queue(max_queued_tokens=5)
    queue.submit(make_request([5], model="a"), now=0.0)
    queue.submit(make_request([5], model="b"), now=0.0)
    assert sorted(queue.models()) == ["a", "b"]
    assert spans(queue.form_batch("b", 100, 10, now=0.0)) == [(2, 0, 1)]
    assert (queue.queued_tokens("a"), queue.queued_tokens("b"), queue.depth()) == (5, 0, 1)
    assert queue.queued_tokens("nope") == 0 and queue.form_batch("nope", 1, 1, 0.0) is None


def test_queued_counts_are_kept_per_lane(make_request):
    queue = Queue(BIG)
    queue.submit(make_request([2, 3]), now=0.0)
    queue.submit(make_request([7], lane=Lane.BATCH), now=0.0)
    assert queue.queued_tokens("m", Lane.INTERACTIVE) == 5
    assert queue.queued_tokens("m", Lane.BATCH) == 7
    assert queue.queued_sequences("m", Lane.INTERACTIVE) == 2


def test_ended_spans_are_compacted_when_no_worker_serves_the_model(make_request):
    queue = Queue(BIG)
    keep = make_request([1])
    queue.submit(keep, now=0.0)
    for _ in range(2 * COMPACT_AFTER):
        request = make_request([1])
        queue.submit(request, now=0.0)
        queue.cancel(request.key)
    lane = queue._models["m"].lanes[Lane.INTERACTIVE]
    assert len(lane) < COMPACT_AFTER + 2
    assert lane[0] == Slice(keep, 0, 1, 0)
    assert spans(queue.form_batch("m", 100, 10, now=0.0)) == [(1, 0, 1)]


def test_draining_a_model_ends_every_request_with_queued_work(make_request):
    queue = Queue(BIG)
    split = make_request([1, 1], model="a")
    queue.submit(split, now=0.0)
    queue.form_batch("a", 1, 10, now=0.0)
    in_flight_only = make_request([1], model="a")
    queue.submit(in_flight_only, now=0.0)
    queue.form_batch("a", 2, 10, now=0.0)  # the rest of `split` and all of `in_flight_only`
    queue.requeue_front([Slice(split, 0, 1, 1)])
    waiting = make_request([1], model="a", lane=Lane.BATCH)
    queue.submit(waiting, now=0.0)
    other = make_request([1], model="b")
    queue.submit(other, now=0.0)
    assert queue.drain_model("a") == [split, waiting]
    assert not split.live and not waiting.live and in_flight_only.live and other.live
    assert queue.queued_sequences("a") == 0 and queue.queued_sequences("b") == 1
    assert queue.drain_model("nope") == []


def test_ended_requests_are_not_held_until_their_deadline(make_request):
    queue = Queue(BIG)
    for _ in range(10 * COMPACT_AFTER):
        request = make_request([1], deadline=1000.0)
        queue.submit(request, now=0.0)
        queue.form_batch("m", 100, 10, now=0.0)
        assert queue.complete(request, 1)
    assert len(queue.requests._deadlines) <= COMPACT_AFTER + 1


def test_a_batch_budget_of_nothing_is_a_bug_not_a_reason_to_refuse(make_request):
    queue = Queue(BIG)
    request = make_request([1])
    queue.submit(request, now=0.0)
    for tokens, sequences in ((0, 10), (10, 0)):
        with pytest.raises(ValueError):
            queue.form_batch("m", tokens, sequences, now=0.0)
    assert request.live


def test_an_isolated_request_is_retried_in_a_batch_of_its_own(make_request):
    queue = Queue(BIG)
    for lengths in ([1, 1], [1], [1]):
        queue.submit(make_request(lengths), now=0.0)
    failed = queue.form_batch("m", 100, 10, now=0.0).slices
    queue.submit(make_request([1]), now=0.0)
    queue.isolate(failed)
    cuts = [spans(queue.form_batch("m", 100, 10, now=0.0)) for _ in range(4)]
    assert cuts == [[(1, 0, 2)], [(2, 0, 1)], [(3, 0, 1)], [(4, 0, 1)]]


def test_an_isolated_request_waits_for_an_empty_batch_and_keeps_it_to_itself(make_request):
    queue = Queue(BIG)
    suspect = make_request([1, 1, 1])
    queue.submit(suspect, now=0.0)
    queue.isolate(queue.form_batch("m", 2, 10, now=0.0).slices)  # sequences 0..1 failed
    queue.submit(make_request([1], lane=Lane.BATCH), now=0.0)
    # Its requeued slice and its never-sent rest go together, and nothing else joins them.
    assert spans(queue.form_batch("m", 100, 10, now=0.0)) == [(1, 0, 2), (1, 2, 3)]
    assert spans(queue.form_batch("m", 100, 10, now=0.0)) == [(2, 0, 1)]


def test_a_live_query_is_dispatched_before_bulk_queued_ahead_of_it(make_request):
    queue = Queue(BIG, aging_s=10.0, live_window_s=1.0)
    queue.submit(make_request([10] * 10, lane=Lane.BATCH), now=0.0)
    held = queue.form_batch("m", 30, 100, now=0.0, bulk_cap=30).bulk_tokens
    assert held == 30  # no live traffic yet: bulk takes a whole batch
    queue.submit(make_request([5]), now=0.5)
    # The worker still holds a full batch of bulk: the next batch carries the query alone.
    batch = queue.form_batch("m", 30, 100, now=0.5, bulk_cap=30, bulk_held=held)
    assert spans(batch) == [(2, 0, 1)] and batch.bulk_tokens == 0
    assert queue.queued_sequences("m", Lane.BATCH) == 7


def test_bulk_held_by_a_worker_is_capped_while_live_and_interactive_work_is_not(make_request):
    queue = Queue(BIG, aging_s=10.0, live_window_s=1.0)
    queue.submit(make_request([5] * 20, lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([25]), now=0.0)
    batch = queue.form_batch("m", 100, 100, now=0.0, bulk_cap=30, bulk_held=20)
    assert spans(batch) == [(2, 0, 1), (1, 0, 2)]  # the query whole, then 10 bulk tokens
    # Still live within the window though nothing interactive waits: nothing over the cap.
    assert queue.live("m", now=0.9)
    assert queue.form_batch("m", 100, 100, now=0.9, bulk_cap=30, bulk_held=30) is None
    # Once live traffic has stopped for the window, bulk fills whole batches again.
    assert not queue.live("m", now=1.0)
    batch = queue.form_batch("m", 100, 100, now=1.0, bulk_cap=30, bulk_held=30)
    assert batch.bulk_tokens == 90


def test_the_live_bulk_cap_is_split_over_the_workers_credits(make_request):
    queue = Queue(BIG, aging_s=10.0, live_window_s=1.0)
    queue.submit(make_request([5] * 20, lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([5]), now=0.0)
    # Split in two (a worker of three credits: one stays free for queries): the cap of 30
    # becomes two bulk batches of 15, so the second is there to start while the first's
    # reply travels; a query still waits behind 30 tokens at most.
    first = queue.form_batch("m", 100, 100, now=0.0, bulk_cap=30, bulk_held=0, bulk_split=2)
    assert spans(first) == [(2, 0, 1), (1, 0, 3)] and first.bulk_tokens == 15
    second = queue.form_batch("m", 100, 100, now=0.0, bulk_cap=30, bulk_held=15, bulk_split=2)
    assert second.bulk_tokens == 15
    assert queue.form_batch("m", 100, 100, now=0.0, bulk_cap=30, bulk_held=30, bulk_split=2) is None
    # An odd cap loses no token to the split (ceil), and one credit keeps the whole cap.
    third = queue.form_batch("m", 100, 100, now=0.5, bulk_cap=31, bulk_held=0, bulk_split=2)
    assert third.bulk_tokens == 15  # whole sequences of 5 within 16
    whole = queue.form_batch("m", 100, 100, now=0.5, bulk_cap=30, bulk_held=0, bulk_split=1)
    assert whole.bulk_tokens == 30


def test_an_aged_bulk_head_shares_the_cap_while_live(make_request):
    queue = Queue(BIG, aging_s=1.0, live_window_s=1.0)
    queue.submit(make_request([4] * 10, lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([4] * 10), now=5.0)
    # Aged: bulk goes first, but only what the cap leaves (8 of its half of 20).
    batch = queue.form_batch("m", 40, 100, now=5.0, bulk_cap=20, bulk_held=12)
    assert spans(batch) == [(1, 0, 2), (2, 0, 8)]
    # Holding its whole cap, an aged head waits: the worker is not starved of bulk.
    batch = queue.form_batch("m", 40, 100, now=5.0, bulk_cap=20, bulk_held=20)
    assert spans(batch) == [(2, 8, 10)]


# ---- a worker with a live lane (form_lane_batch) ----------------------------------------------


def test_with_a_live_lane_queries_and_bulk_never_share_a_batch(make_request):
    queue = Queue(BIG, aging_s=10.0, live_window_s=1.0)
    queue.submit(make_request([10] * 10, lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([5, 5]), now=0.0)
    # Interactive first, alone, though the budget has room for bulk beside it.
    batch = queue.form_lane_batch("m", 100, 100, now=0.0, live_tokens=50, bulk_allowed=True)
    assert spans(batch) == [(2, 0, 2)] and batch.bulk_tokens == 0
    # Then bulk fills the whole budget, live or not: no cap on what the worker holds.
    assert queue.live("m", now=0.1)
    batch = queue.form_lane_batch("m", 100, 100, now=0.1, live_tokens=50, bulk_allowed=True)
    assert spans(batch) == [(1, 0, 10)] and batch.bulk_tokens == 100


def test_with_a_live_lane_bulk_waits_for_a_credit_beyond_the_lanes(make_request):
    queue = Queue(BIG, aging_s=10.0)
    queue.submit(make_request([10] * 4, lane=Lane.BATCH), now=0.0)
    assert queue.form_lane_batch("m", 100, 100, now=0.0, live_tokens=50, bulk_allowed=False) is None
    queue.submit(make_request([5]), now=0.0)  # ... while a query still takes the lane's credit
    batch = queue.form_lane_batch("m", 100, 100, now=0.0, live_tokens=50, bulk_allowed=False)
    assert spans(batch) == [(2, 0, 1)]


def test_with_a_live_lane_interactive_batches_are_cut_at_its_size_on_its_credit(make_request):
    queue = Queue(BIG, aging_s=10.0)
    queue.submit(make_request([20, 20, 20]), now=0.0)
    queue.submit(make_request([80]), now=0.0)  # longer than the lane: goes alone, whole
    cuts = [
        spans(queue.form_lane_batch("m", 100, 100, now=0.0, live_tokens=50, bulk_allowed=False))
        for _ in range(3)
    ]
    assert cuts == [[(1, 0, 2)], [(1, 2, 3)], [(2, 0, 1)]]


def test_with_a_live_lane_a_flood_of_queries_fills_whole_batches_on_other_credits(make_request):
    queue = Queue(BIG, aging_s=10.0)
    for _ in range(6):
        queue.submit(make_request([20]), now=0.0)
    # A credit beyond the lane's: the whole budget, as bulk would get (the compute thread).
    batch = queue.form_lane_batch("m", 100, 100, now=0.0, live_tokens=50, bulk_allowed=True)
    assert batch.tokens == 100 and batch.bulk_tokens == 0
    # The lane's own credit: cut at its size.
    batch = queue.form_lane_batch("m", 100, 100, now=0.0, live_tokens=50, bulk_allowed=False)
    assert batch.tokens == 20


def test_with_a_live_lane_an_aged_bulk_head_goes_before_waiting_queries(make_request):
    queue = Queue(BIG, aging_s=1.0)
    queue.submit(make_request([10] * 4, lane=Lane.BATCH), now=0.0)
    queue.submit(make_request([5]), now=5.0)
    batch = queue.form_lane_batch("m", 100, 100, now=5.0, live_tokens=50, bulk_allowed=True)
    assert spans(batch) == [(1, 0, 4)]  # bulk, whole budget, alone
    batch = queue.form_lane_batch("m", 100, 100, now=5.0, live_tokens=50, bulk_allowed=False)
    assert spans(batch) == [(2, 0, 1)]

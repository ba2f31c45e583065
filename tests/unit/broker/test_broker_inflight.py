from __future__ import annotations

from mesh.broker.inflight import InFlight
from mesh.broker.queue import Queue, Slice


def slices_of(make_request, *lengths_per_request) -> list[Slice]:
    return [Slice(make_request(lengths), 0, len(lengths), 1) for lengths in lengths_per_request]


def test_a_result_pops_its_batch_once_and_duplicates_find_nothing(make_request):
    table = InFlight(first_id=1)
    batch = table.add(b"w", slices_of(make_request, [1, 2]), now=0.0, deadline=10.0)
    assert (batch.batch_id, batch.sequences, batch.tokens, batch.attempt) == (1, 2, 3, 1)
    assert batch.batch_id in table
    assert table.pop(batch.batch_id) is batch
    assert table.pop(batch.batch_id) is None
    assert table.pop(12345) is None
    assert len(table) == 0 and table.for_worker(b"w") == []


def test_a_result_from_a_worker_that_does_not_hold_the_batch_is_ignored(make_request):
    table = InFlight(first_id=1)
    batch = table.add(b"w1", slices_of(make_request, [1]), now=0.0, deadline=10.0)
    assert table.pop(batch.batch_id, worker=b"w2") is None
    assert table.pop(batch.batch_id, worker=b"w1") is batch


def test_batch_ids_are_unique_and_start_at_random():
    assert InFlight()._next_id != InFlight()._next_id
    table = InFlight(first_id=7)
    ids = [table.add(b"w", [], now=0.0, deadline=1.0).batch_id for _ in range(3)]
    assert ids == [7, 8, 9]


def test_a_dead_workers_batches_come_back_in_dispatch_order(make_request):
    table = InFlight(first_id=1)
    first = table.add(b"w1", slices_of(make_request, [1]), now=0.0, deadline=10.0)
    other = table.add(b"w2", slices_of(make_request, [1]), now=0.0, deadline=10.0)
    second = table.add(b"w1", slices_of(make_request, [1]), now=1.0, deadline=11.0)
    assert table.for_worker(b"w1") == [first, second]
    assert table.remove_worker(b"w1") == [first, second]
    assert table.remove_worker(b"w1") == []
    assert table.pop(first.batch_id) is None
    assert list(table.for_worker(b"w2")) == [other] and len(table) == 1


def test_overdue_lists_the_batches_of_hung_workers_and_leaves_them(make_request):
    table = InFlight(first_id=1)
    table.add(b"w1", slices_of(make_request, [1]), now=0.0, deadline=5.0)
    late = table.add(b"w2", slices_of(make_request, [1]), now=0.0, deadline=2.0)
    assert table.overdue(now=1.9) == []
    assert table.overdue(now=2.0) == [late]
    assert len(table) == 2


def test_slices_at_the_attempt_cap_are_given_up_and_the_rest_requeued(make_request):
    table = InFlight(max_attempts=2)
    request = make_request([1] * 4)
    pieces = [Slice(request, 0, 1, 1), Slice(request, 1, 2, 2), Slice(request, 2, 4, 1)]
    requeue, give_up = table.split_retry(pieces)
    assert requeue == [pieces[0], pieces[2]]
    assert give_up == [pieces[1]]


def test_attempts_travel_with_sequences_through_requeue_until_given_up(make_request):
    queue, table = Queue(10**6), InFlight(max_attempts=3, first_id=1)
    request = make_request([1, 1])
    queue.submit(request, now=0.0)
    for attempt in (1, 2, 3):
        batch = queue.form_batch("m", 100, 10, now=0.0)
        assert [piece.attempt for piece in batch.slices] == [attempt]
        table.add(b"w", batch.slices, now=0.0, deadline=1.0)
        lost = table.remove_worker(b"w")
        requeue, give_up = table.split_retry(s for b in lost for s in b.slices)
        for piece in give_up:
            assert queue.fail_request(piece.request)
        queue.requeue_front(requeue)
    assert give_up and not request.live
    assert queue.queued_sequences("m") == 0

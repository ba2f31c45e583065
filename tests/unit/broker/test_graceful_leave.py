"""A worker that leaves on purpose (Disconnect) does not spend its batches' attempts."""

from __future__ import annotations

from proto_msgs import BatchAssign, Disconnect, RequestError, RequestResult
from tests.unit.broker.fakes import INGRESS, Harness, answer, ready, submit


def test_batches_of_workers_that_leave_in_turn_are_requeued_without_spending_attempts():
    h = Harness(max_attempts=1)
    h.add_worker(b"w0", ready(name="w0", credits=1))
    h.submit(submit(1, [4, 4]))
    h.back.take(BatchAssign)  # w0 computes it... and leaves first
    for leaving, name in ((b"w0", b"w1"), (b"w1", b"w2"), (b"w2", b"w3")):
        # A rolling restart: the next one registers, the holder leaves, the next takes it.
        h.add_worker(name, ready(name=name.decode()))
        h.back.push(leaving, Disconnect(reason="stopping"))
        h.pump()
        [(to, _)] = h.back.take(BatchAssign)
        assert to == name
    assert not h.front.take(RequestError), "leaving is not failing: no attempt was spent"
    h.add_worker(b"w4", ready(name="w4"))
    h.back.push(b"w3", Disconnect(reason="stopping"))
    h.pump()
    [(_, batch)] = h.back.take(BatchAssign)
    h.back.push(b"w4", answer(batch))
    h.pump()
    results = h.front.take(RequestResult)
    assert [to for to, _ in results] == [INGRESS]
    assert sorted(results[0][1].indices.tolist()) == [0, 1]


def test_a_worker_that_dies_still_spends_the_attempt():
    h = Harness(max_attempts=1)
    h.add_worker(b"w1")
    h.add_worker(b"w2")
    h.submit(submit(1, [4]))
    [(holder, _)] = h.back.take(BatchAssign)
    h.broker._bury(holder, "silent", h.now)  # what the heartbeat expiry does
    [(_, error)] = h.front.take(RequestError)
    assert "failed on this input 1 times" in error.message

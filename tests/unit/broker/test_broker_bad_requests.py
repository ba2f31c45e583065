"""One bad request fails only itself: checked at submit, isolated after a batch error."""

from __future__ import annotations

import numpy as np
import pytest

from proto_msgs import BatchAssign, BatchError, ErrorCode, RequestError, RequestResult
from proto_msgs.checks import submit_problem
from proto_msgs.small_arrays import SMALL
from tests.unit.broker.fakes import DIMS, MODEL, Harness, answer, card, ready, submit


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (submit(1, [3], token=100), "vocabulary"),
        (submit(1, [3], dims=DIMS + 1), "dimensions"),
        (submit(1, [3, 17]), "more than 16 tokens, the limit of model"),
    ],
)
def test_a_submit_breaking_the_model_card_is_refused_alone_and_never_batched(bad, says):
    h = Harness()
    h.add_worker()
    h.submit(bad)
    h.submit(submit(2, [3]))
    errors = h.front.take(RequestError)
    assert [(m.cid, m.code) for _, m in errors] == [(1, ErrorCode.INVALID_INPUT)]
    assert says in errors[0][1].message
    batches = [m for _, m in h.back.take(BatchAssign)]
    assert len(batches) == 1 and batches[0].n == 1  # only the valid request was sent


def test_a_submit_by_alias_runs_under_the_models_name_and_an_unknown_name_is_not_found():
    h = Harness()
    h.add_worker(b"w1", ready(card(aliases=["org/m"])))
    h.submit(submit(1, [3], model="org/m"))
    h.submit(submit(2, [3], model="org/other"))
    [(_, batch)] = h.back.take(BatchAssign)
    assert batch.model == MODEL  # the worker gets its own model's name, never an alias
    [(_, error)] = h.front.take(RequestError)
    assert (error.cid, error.code) == (2, ErrorCode.MODEL_NOT_FOUND)
    assert error.message == "model 'org/other' is not served"


def test_a_submit_within_the_card_is_served():
    h = Harness()
    h.add_worker()
    h.submit(submit(1, [16, 1], token=99, dims=DIMS))
    [(_, batch)] = h.back.take(BatchAssign)
    assert batch.offsets.tolist() == [0, 16, 17] and batch.token_ids.dtype == np.int32
    h.back.push(b"w1", answer(batch))
    h.pump()
    [(_, result)] = h.front.take(RequestResult)
    assert result.cid == 1 and list(result.indices) == [0, 1]


def fail(h: Harness, batch: BatchAssign, retryable: bool = False) -> None:
    h.back.push(b"w1", BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, "bad input", retryable))
    h.pump()


def test_a_batch_error_fails_only_the_request_that_fails_alone():
    h = Harness(max_attempts=3)
    h.add_worker()  # one credit: the three requests queue into one batch
    h.submit(submit(1, [2]))
    for cid in (2, 3):
        h.submit(submit(cid, [2]))
    first = [m for _, m in h.back.take(BatchAssign)]
    assert [b.n for b in first] == [1]
    h.back.push(b"w1", answer(first[0]))
    h.pump()
    [(_, mixed)] = h.back.take(BatchAssign)
    assert mixed.n == 2  # requests 2 and 3 share a batch; say 3 is bad
    fail(h, mixed)
    assert h.front.take(RequestError) == []
    # Each is retried in a batch of its own.
    [(_, alone_2)] = h.back.take(BatchAssign)
    assert alone_2.n == 1
    h.back.push(b"w1", answer(alone_2))
    h.pump()
    [(_, alone_3)] = h.back.take(BatchAssign)
    assert alone_3.n == 1
    fail(h, alone_3)
    sent = h.front.take()
    assert [(type(m), m.cid) for _, m in sent] == [(RequestResult, 2), (RequestError, 3)]
    assert sent[1][1].code == ErrorCode.INVALID_INPUT and sent[1][1].message == "bad input"
    assert len(h.broker.queue.requests) == 0


def test_an_expired_batch_fails_its_requests_together_without_isolating_them():
    h = Harness()
    h.add_worker()
    h.submit(submit(1, [2]))
    for cid in (2, 3):
        h.submit(submit(cid, [2]))
    [(_, first)] = h.back.take(BatchAssign)
    h.back.push(b"w1", answer(first))
    h.pump()
    [(_, mixed)] = h.back.take(BatchAssign)
    assert mixed.n == 2
    # The batch's own deadline passed on the worker: no input is at fault, so no one-by-one
    # retries of innocent requests exactly when the worker is slow.
    h.back.push(b"w1", BatchError(mixed.batch_id, ErrorCode.DEADLINE_EXCEEDED, "expired", False))
    h.pump()
    assert h.back.take(BatchAssign) == []
    errors = [m for _, m in h.front.take(RequestError)]
    assert sorted(m.cid for m in errors) == [2, 3]
    assert {m.code for m in errors} == {ErrorCode.DEADLINE_EXCEEDED}


def test_isolation_keeps_the_attempt_cap():
    h = Harness(max_attempts=1)
    h.add_worker()
    h.submit(submit(1, [2]))
    h.submit(submit(2, [2]))
    h.submit(submit(3, [2]))
    [(_, first)] = h.back.take(BatchAssign)
    h.back.push(b"w1", answer(first))
    h.pump()
    [(_, mixed)] = h.back.take(BatchAssign)
    fail(h, mixed)
    codes = sorted((m.cid, m.code) for _, m in h.front.take(RequestError))
    assert codes == [(2, ErrorCode.WORKER_FAILED), (3, ErrorCode.WORKER_FAILED)]


@pytest.mark.parametrize("n", [2, SMALL, SMALL + 1])
def test_the_card_checks_read_few_and_many_entries_alike(n):
    """Short arrays are reduced in Python, long ones in numpy: the same answers."""
    info = card()  # a vocabulary of 100, at most 16 tokens

    def problem(msg, model=info) -> str:
        found = submit_problem(model, msg, msg.offsets[1:] - msg.offsets[:-1])
        return "" if found is None else found.message

    fine = submit(1, [1] * n)
    assert submit_problem(info, fine, fine.offsets[1:] - fine.offsets[:-1]) is None
    outside = submit(1, [1] * n, token=99)
    outside.token_ids[-1] = 100
    assert "token id 100 is outside" in problem(outside)
    long = submit(1, [1] * (n - 1) + [17])
    assert f"input[{n - 1}] has 17 tokens" in problem(long)
    skipped = submit(1, [2] * (n - 1) + [1])
    skipped.output.pool_skip = 1
    assert f"input[{n - 1}] keeps no token" in problem(skipped, card(include_prompt=False))

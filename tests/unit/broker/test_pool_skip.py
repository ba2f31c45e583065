"""Requests that leave their prompt out of the pooling (``OutputOptions.pool_skip``): batched
together but never in one output group with another skip; refused when the model pools its
prompts, or when a sequence would keep nothing to pool."""

from __future__ import annotations

import dataclasses

import pytest

from proto_msgs import BatchAssign, ErrorCode, OutputOptions, RequestError, SubmitRequest
from tests.unit.broker.fakes import Harness, answer, card, ready, submit


def _skipping(cid: int, lengths: list[int], skip: int) -> SubmitRequest:
    return dataclasses.replace(submit(cid, lengths), output=OutputOptions(pool_skip=skip))


def _harness(include_prompt: bool) -> Harness:
    h = Harness()
    h.add_worker(msg=ready(card(include_prompt=include_prompt)))
    return h


def test_other_skips_share_a_batch_in_other_output_groups() -> None:
    h = Harness()
    h.add_worker(msg=ready(card(include_prompt=False), credits=1))
    h.submit(submit(9, [2]))  # takes the only credit; the next three queue into one batch
    for cid, skip in ((1, 2), (2, 3), (3, 2)):
        h.submit(_skipping(cid, [5, 4], skip))
    first = [m for _, m in h.back.take(BatchAssign)]
    assert [b.n for b in first] == [1]
    h.back.push(b"w1", answer(first[0]))
    h.pump()
    [(_, batch)] = h.back.take(BatchAssign)
    assert batch.n == 6
    assert [o.pool_skip for o in batch.outputs] == [2, 3]
    assert batch.output_index.tolist() == [0, 0, 1, 1, 0, 0]


@pytest.mark.parametrize(
    ("include_prompt", "lengths", "skip", "says"),
    [
        (True, [5], 2, "pools it"),
        (False, [5, 2], 2, "input[1] keeps no token after the prompt's 2"),
    ],
)
def test_a_skip_the_model_cannot_take_is_refused(include_prompt, lengths, skip, says) -> None:
    h = _harness(include_prompt)
    h.submit(_skipping(1, lengths, skip))
    [(_, error)] = h.front.take(RequestError)
    assert error.code == ErrorCode.INVALID_INPUT and says in error.message
    assert not h.back.take(BatchAssign)

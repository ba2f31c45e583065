"""Sparse requests (output kind "sparse") at the broker: refused, alone, by a model that gives no
sparse weights, and a sparse model refuses every other kind; requests of other ``top_k`` or
``threshold`` share a batch but never an output group."""

from __future__ import annotations

import dataclasses

import pytest

from proto_msgs import BatchAssign, ErrorCode, OutputOptions, RequestError, SubmitRequest
from tests.unit.broker.fakes import Harness, answer, card, ready, submit


def _sparse(cid: int, lengths: list[int], top_k: int = 8, threshold: float = 0.0) -> SubmitRequest:
    output = OutputOptions(normalize=False, kind="sparse", top_k=top_k, threshold=threshold)
    return dataclasses.replace(submit(cid, lengths), output=output)


@pytest.mark.parametrize(
    ("task", "request_", "says"),
    [
        ("embed", _sparse(1, [3]), "has no sparse weights"),
        ("sparse", submit(1, [3]), "gives sparse weights only"),
    ],
)
def test_a_kind_the_model_does_not_give_is_refused(task, request_, says) -> None:
    h = Harness()
    h.add_worker(msg=ready(card(task=task)))
    h.submit(request_)
    [(_, error)] = h.front.take(RequestError)
    assert error.code == ErrorCode.INVALID_INPUT and says in error.message
    assert not h.back.take(BatchAssign)


def test_other_top_k_share_a_batch_in_other_output_groups() -> None:
    h = Harness()
    h.add_worker(msg=ready(card(task="sparse"), credits=1))
    h.submit(_sparse(9, [2]))  # takes the only credit; the next three queue into one batch
    for cid, top_k, threshold in ((1, 8, 0.0), (2, 16, 0.0), (3, 8, 0.5)):
        h.submit(_sparse(cid, [4], top_k, threshold))
    [(_, first)] = h.back.take(BatchAssign)
    h.back.push(b"w1", answer(first))
    h.pump()
    [(_, batch)] = h.back.take(BatchAssign)
    assert [(o.top_k, o.threshold) for o in batch.outputs] == [(8, 0.0), (16, 0.0), (8, 0.5)]
    assert batch.output_index.tolist() == [0, 1, 2]


def test_a_lexical_embedder_takes_sparse_and_dense_requests_into_one_batch() -> None:
    h = Harness()
    h.add_worker(msg=ready(card(lexical=True), credits=1))
    h.submit(submit(9, [2]))  # takes the only credit; the next two queue into one batch
    h.submit(_sparse(1, [4]))
    h.submit(submit(2, [4]))
    assert not h.front.take(RequestError)
    [(_, first)] = h.back.take(BatchAssign)
    h.back.push(b"w1", answer(first))
    h.pump()
    [(_, batch)] = h.back.take(BatchAssign)
    assert sorted(o.kind for o in batch.outputs) == ["float32", "sparse"]

"""Cross-encoder pairs through the broker: each sequence's ``segment_b_start`` travels with it
when the queue cuts a request across batches (and as 0 for batch-mates without pairs); pairs
for an embedding model are refused at the door."""

from __future__ import annotations

import dataclasses

import numpy as np

from proto_msgs import BatchAssign, ErrorCode, OutputOptions, RequestError, RequestResult
from tests.unit.broker.fakes import Harness, answer, card, ready, submit

SCORER = card(task="score", labels=["LABEL_0"], activation="sigmoid", dims=1)


def _pairs(cid: int, lengths: list[int], starts: list[int]):  # noqa: ANN202
    msg = submit(cid, lengths)
    return dataclasses.replace(
        msg,
        output=OutputOptions(dims=None, normalize=False),
        segment_b_start=np.asarray(starts, dtype=np.int32),
    )


def test_a_request_of_pairs_cut_across_batches_keeps_each_pairs_split() -> None:
    h = Harness()
    h.add_worker(msg=ready(SCORER, max_batch_tokens=40, credits=1))
    lengths = [12, 10, 14, 9, 11, 13]
    starts = [5, 3, 0, 4, 6, 2]  # the third is a single text
    h.submit(_pairs(1, lengths, starts))
    seen: list[int] = []
    while True:
        batches = h.back.take(BatchAssign)
        if not batches:
            break
        [(_, batch)] = batches
        assert batch.segment_b_start is not None and batch.segment_b_start.dtype == np.int32
        assert batch.n < len(lengths)  # the budget cuts the request
        assert np.diff(batch.offsets).tolist() == lengths[len(seen) : len(seen) + batch.n]
        seen += batch.segment_b_start.tolist()
        h.back.push(b"w1", answer(batch))
        h.pump()
    assert seen == starts
    results = h.front.take(RequestResult)
    assert sorted(i for _, r in results for i in r.indices.tolist()) == list(range(len(lengths)))


def test_batch_mates_without_pairs_get_zero_and_a_batch_without_pairs_carries_none() -> None:
    h = Harness()
    h.add_worker(msg=ready(SCORER, credits=1))
    h.submit(dataclasses.replace(submit(9, [3]), output=OutputOptions(normalize=False)))
    [(_, alone)] = h.back.take(BatchAssign)
    assert alone.segment_b_start is None  # single texts only: the field is not sent at all
    h.submit(dataclasses.replace(submit(2, [4, 5]), output=OutputOptions(normalize=False)))
    h.submit(_pairs(3, [6], [2]))
    h.back.push(b"w1", answer(alone))
    h.pump()
    [(_, batch)] = h.back.take(BatchAssign)
    assert batch.segment_b_start.tolist() == [0, 0, 2]


def test_pairs_for_an_embedding_model_are_refused() -> None:
    h = Harness()
    h.add_worker(msg=ready(card()))
    h.submit(_pairs(1, [6, 6], [2, 3]))
    [(_, error)] = h.front.take(RequestError)
    assert error.code == ErrorCode.INVALID_INPUT and "cross-encoders" in error.message
    assert not h.back.take(BatchAssign)


def test_a_worker_announcing_another_task_under_a_served_name_is_refused() -> None:
    h = Harness()
    h.add_worker(b"w1", ready(SCORER))
    h.add_worker(b"w2", ready(card(dims=1)))
    assert len(h.broker.registry.workers) == 1

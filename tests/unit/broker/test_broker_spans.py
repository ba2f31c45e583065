"""Span requests (contextualized chunks, per-token vectors) through the broker: each
sequence's spans follow it when the queue cuts the request across batches, when a batch is
requeued and when it is isolated, and every result chunk maps its rows back to (sequence, span)."""

from __future__ import annotations

import dataclasses

import numpy as np

from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    ErrorCode,
    OutputOptions,
    RequestResult,
)
from tests.unit.broker.fakes import DIMS, Harness, answer, ready, submit

LENGTHS = [12, 10, 14, 9, 11, 13]
# (start, end) per chunk, relative to each document; every document has at least one.
CHUNKS = [
    [(1, 5), (5, 11)],
    [(1, 9)],
    [(1, 2), (2, 7), (7, 13)],
    [(0, 9)],
    [(1, 10)],
    [(1, 4), (4, 6), (6, 8), (8, 12)],
]


def _span_submit(cid: int):  # noqa: ANN202
    spans = np.array([s for doc in CHUNKS for s in doc], dtype=np.int32)
    span_offsets = np.concatenate([[0], np.cumsum([len(d) for d in CHUNKS])]).astype(np.int32)
    return dataclasses.replace(
        submit(cid, LENGTHS),
        output=OutputOptions(rows="spans"),
        spans=spans,
        span_offsets=span_offsets,
    )


def _span_answer(batch: BatchAssign) -> BatchResult:
    """Each span row says which span it is: (start, end, length of its sequence, ...)."""
    assert batch.spans is not None and batch.span_offsets is not None
    lengths = np.diff(batch.offsets)
    counts = np.diff(batch.span_offsets)
    seq_of_span = np.repeat(np.arange(batch.n), counts)
    out = []
    for g, opt in enumerate(batch.outputs):
        if opt.rows != "spans":
            out.append(answer(batch).embeddings[g])
            continue
        mine = batch.output_index[seq_of_span] == g
        rows = np.zeros((int(mine.sum()), DIMS), dtype=np.float32)
        rows[:, 0] = batch.spans[mine, 0]
        rows[:, 1] = batch.spans[mine, 1]
        rows[:, 2] = lengths[seq_of_span[mine]]
        out.append(rows)
    return BatchResult(batch_id=batch.batch_id, compute_ms=1.0, embeddings=out)


def _assemble(results: list[RequestResult]) -> dict[int, list[tuple[int, int, int]]]:
    got: dict[int, list[tuple[int, int, int]]] = {}
    for r in results:
        assert r.row_offsets is not None
        for j, i in enumerate(r.indices.tolist()):
            rows = r.embeddings[r.row_offsets[j] : r.row_offsets[j + 1]]
            got.setdefault(i, [tuple(int(v) for v in row[:3]) for row in rows])
    return got


def _expected() -> dict[int, list[tuple[int, int, int]]]:
    return {i: [(a, b, LENGTHS[i]) for a, b in doc] for i, doc in enumerate(CHUNKS)}


def test_a_span_request_cut_across_batches_and_requeued_maps_every_row_back() -> None:
    h = Harness()
    h.add_worker(msg=ready(max_batch_tokens=30, credits=1))
    h.submit(_span_submit(1))
    first = True
    while batches := h.back.take(BatchAssign):
        [(_, batch)] = batches
        assert batch.n < len(LENGTHS)  # the budget cuts the request
        if first:  # the worker fails it once: its sequences go back with their spans
            h.back.push(b"w1", BatchError(batch.batch_id, int(ErrorCode.WORKER_FAILED), "x", True))
            first = False
        else:
            h.back.push(b"w1", _span_answer(batch))
        h.pump()
    assert _assemble([r for _, r in h.front.take(RequestResult)]) == _expected()


def test_an_isolated_span_request_keeps_its_spans_and_its_batch_mate_its_rows() -> None:
    h = Harness()
    h.add_worker(msg=ready(max_batch_tokens=200, credits=1))
    h.submit(submit(7, [4, 4]))  # dispatched alone at once: the worker has one credit
    [(_, lone)] = h.back.take(BatchAssign)
    h.submit(_span_submit(1))
    h.submit(submit(8, [5]))
    h.back.push(b"w1", answer(lone))
    h.pump()
    [(_, mixed)] = h.back.take(BatchAssign)
    # Spans only on the span group's sequences; the plain request's have none.
    assert mixed.span_offsets is not None and np.diff(mixed.span_offsets)[-1] == 0
    h.back.push(b"w1", BatchError(mixed.batch_id, int(ErrorCode.INVALID_INPUT), "bad", False))
    h.pump()
    plain_rows = 0
    while batches := h.back.take(BatchAssign):
        [(_, batch)] = batches
        assert len({o.rows for o in batch.outputs}) == 1  # isolated: one request a batch
        reply = _span_answer(batch) if batch.spans is not None else answer(batch)
        plain_rows += 0 if batch.spans is not None else batch.n
        h.back.push(b"w1", reply)
        h.pump()
    results = [r for _, r in h.front.take(RequestResult)]
    assert _assemble([r for r in results if r.cid == 1]) == _expected()
    assert plain_rows == 1
    assert all(r.row_offsets is None for r in results if r.cid != 1)

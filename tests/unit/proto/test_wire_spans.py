"""Spans on the wire: SubmitRequest and BatchAssign carry them, RequestResult maps rows back
with ``row_offsets``; all round-trip, a message without them decodes as before, and spans that
overlap, fall outside their sequence or disagree with the output's rows are refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from proto_msgs import (
    BatchAssign,
    OutputOptions,
    ProtocolError,
    RequestResult,
    SubmitRequest,
)
from proto_msgs.codec import decode, encode


def _submit(spans: list[tuple[int, int]] | None, counts: list[int] | None) -> SubmitRequest:
    return SubmitRequest(
        cid=1,
        model="m",
        lane=0,
        timeout_ms=None,
        output=OutputOptions(rows="spans" if spans is not None else "sequence"),
        token_ids=np.arange(1, 10, dtype=np.int32),
        offsets=np.array([0, 4, 9], dtype=np.int32),
        spans=None if spans is None else np.array(spans, dtype=np.int32).reshape(-1, 2),
        span_offsets=None
        if counts is None
        else np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
    )


def test_spans_round_trip_and_a_request_without_them_sends_no_frame() -> None:
    msg = _submit([(1, 2), (2, 3), (0, 5)], [2, 1])
    back = decode(encode(msg))
    assert back.spans.tolist() == [[1, 2], [2, 3], [0, 5]]
    assert back.span_offsets.tolist() == [0, 2, 3] and back.output.rows == "spans"
    plain = decode(encode(_submit(None, None)))
    assert plain.spans is None and plain.span_offsets is None and plain.output.rows == "sequence"


def test_request_result_rows_map_back_and_default_to_one_per_index() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    result = RequestResult(
        7, 9, np.array([0, 1], np.int32), rows, row_offsets=np.array([0, 3, 4], np.int32)
    )
    back = decode(encode(result))
    assert back.row_offsets.tolist() == [0, 3, 4] and back.embeddings.shape == (4, 3)
    one = RequestResult(7, 9, np.array([0, 1], np.int32), rows[:2])
    assert decode(encode(one)).row_offsets is None
    with pytest.raises(ProtocolError):
        decode(encode(dataclasses.replace(result, row_offsets=np.array([0, 3, 5], np.int32))))


@pytest.mark.parametrize(
    ("spans", "counts"),
    [
        ([(1, 3), (2, 4), (0, 5)], [2, 1]),  # overlapping
        ([(1, 5), (0, 5)], [1, 1]),  # past its sequence's end (4 tokens)
        ([(2, 2), (0, 5)], [1, 1]),  # empty
        ([(0, 5)], [0, 1]),  # a sequence without a span
    ],
)
def test_bad_spans_are_refused(spans: list[tuple[int, int]], counts: list[int]) -> None:
    with pytest.raises(ProtocolError):
        decode(encode(_submit(spans, counts)))


def test_spans_come_exactly_with_span_rows() -> None:
    msg = dataclasses.replace(_submit([(0, 4), (0, 5)], [1, 1]), output=OutputOptions())
    with pytest.raises(ProtocolError, match="span rows"):
        decode(encode(msg))


def test_a_batch_gives_spans_only_to_the_sequences_of_span_groups() -> None:
    batch = BatchAssign(
        batch_id=1,
        model="m",
        timeout_ms=100,
        outputs=[OutputOptions(), OutputOptions(rows="spans")],
        output_index=np.array([0, 1], np.int32),
        token_ids=np.arange(1, 10, dtype=np.int32),
        offsets=np.array([0, 4, 9], dtype=np.int32),
        spans=np.array([[0, 2], [2, 5]], np.int32),
        span_offsets=np.array([0, 0, 2], np.int32),
    )
    assert decode(encode(batch)).span_offsets.tolist() == [0, 0, 2]
    wrong = dataclasses.replace(batch, output_index=np.array([1, 0], np.int32))
    with pytest.raises(ProtocolError, match="span groups"):
        decode(encode(wrong))

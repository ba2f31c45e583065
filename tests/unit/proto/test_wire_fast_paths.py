"""The decode's shortcuts refuse what the full checks refuse.

``validate`` checks arrays of up to ``SMALL`` entries in Python and larger ones with
numpy; the body reader takes int, float, bool and short str values without calling their
checker. Each case here is sent on both sides of the size cut, or through the shortcut's guard,
and must meet the same ProtocolError.
"""

from __future__ import annotations

import numpy as np
import pytest
import wire_samples

from proto_msgs import (
    BatchAssign,
    OutputOptions,
    ProtocolError,
    RequestResult,
    SubmitRequest,
    decode,
    encode,
    limits,
)
from proto_msgs.small_arrays import SMALL

# One under, at and over the size cut, and well past it.
SIZES = [1, 2, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL]


def sequences(n: int) -> list[list[int]]:
    """``n`` sequences of 1-3 tokens, the ids counting up across them."""
    lengths = [1 + i % 3 for i in range(n)]
    starts = np.cumsum([0, *lengths])
    return [list(range(a, a + length)) for a, length in zip(starts, lengths, strict=False)]


def ragged(n: int) -> tuple[np.ndarray, np.ndarray]:
    return wire_samples.ragged(sequences(n))


def submit(n: int, **changes) -> SubmitRequest:
    # A one-letter model name: the string-limit cases lower the limit under the default's.
    return wire_samples.submit(sequences(n), **{"model": "m", **changes})


def assign(n: int, **changes) -> BatchAssign:
    ids, offsets = ragged(n)
    groups = min(n, 2)  # 1..n groups
    fields = dict(
        batch_id=1,
        model="m",
        timeout_ms=1000,
        outputs=[OutputOptions() for _ in range(groups)],
        output_index=np.arange(n, dtype=np.int32) % groups,
        token_ids=ids,
        offsets=offsets,
    )
    return BatchAssign(**{**fields, **changes})


def result(k: int, **changes) -> RequestResult:
    fields = dict(
        cid=5,
        prompt_tokens=k,
        indices=np.arange(k, dtype=np.int32),
        embeddings=np.ones((k, 4), np.float32),
    )
    return RequestResult(**{**fields, **changes})


def round_trip(msg):
    return decode([bytes(memoryview(f)) for f in encode(msg)])


def refused(msg, match: str) -> ProtocolError:
    with pytest.raises(ProtocolError, match=match) as info:
        round_trip(msg)
    return info.value


def changed(values: np.ndarray, at: int, value: int) -> np.ndarray:
    out = values.copy()
    out[at] = value
    return out


@pytest.mark.parametrize("n", SIZES)
def test_sound_messages_decode_on_both_sides_of_the_size_cut(n):
    assert round_trip(submit(n)).n == n
    assert round_trip(assign(n)).n == n
    assert len(round_trip(result(n, row_offsets=np.arange(n + 1, dtype=np.int32))).indices) == n


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("make", [submit, assign], ids=["submit", "assign"])
@pytest.mark.parametrize(
    "where, value",
    [(0, 1), (-1, 10**6), (-1, -1), ("middle", "repeat"), ("middle", "fall")],
    ids=["first", "past-the-end", "short-end", "repeated", "falling"],
)
def test_offsets_not_rising_from_zero_to_the_end_are_refused_at_any_size(n, make, where, value):
    offsets = make(n).offsets
    if where == "middle":
        if n < 2:
            pytest.skip("one sequence has no middle offset")
        i = n // 2
        value = offsets[i - 1] if value == "repeat" else offsets[i - 1] - 1
        where = i
    refused(make(n, offsets=changed(offsets, where, value)), "offsets must start at 0")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("make", [submit, assign], ids=["submit", "assign"])
@pytest.mark.parametrize("at", [0, -1])
def test_a_negative_token_id_is_refused_at_any_size(n, make, at):
    msg = make(n)
    msg.token_ids = changed(msg.token_ids, at, -1)
    assert refused(msg, "negative token id")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("value", [-1, "groups"])
@pytest.mark.parametrize("at", [0, -1])
def test_an_output_index_outside_the_groups_is_refused_at_any_size(n, value, at):
    msg = assign(n)
    value = len(msg.outputs) if value == "groups" else value
    msg.output_index = changed(msg.output_index, at, value)
    refused(msg, "output_index out of range")


@pytest.mark.parametrize("n", SIZES)
def test_a_span_group_that_no_sequence_uses_needs_no_spans_at_any_size(n):
    if n < 2:
        pytest.skip("two groups need two sequences")
    outputs = [OutputOptions(), OutputOptions(rows="spans")]
    assert round_trip(assign(n, outputs=outputs, output_index=np.zeros(n, np.int32))).n == n
    used = assign(n, outputs=outputs, output_index=changed(np.zeros(n, np.int32), -1, 1))
    refused(used, "a span group without spans")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("value", [-1, "length"])
@pytest.mark.parametrize("at", [0, -1])
def test_a_pair_start_outside_its_sequence_is_refused_at_any_size(n, value, at):
    msg = submit(n, segment_b_start=np.zeros(n, np.int32))
    assert round_trip(msg).n == n
    bad = int(np.diff(msg.offsets)[at]) if value == "length" else value
    msg.segment_b_start = changed(msg.segment_b_start, at, bad)
    refused(msg, "segment_b_start must lie inside its sequence")


@pytest.mark.parametrize("k", SIZES)
@pytest.mark.parametrize("at", [0, -1])
def test_a_negative_result_index_is_refused_at_any_size(k, at):
    refused(result(k, indices=changed(np.arange(k, dtype=np.int32), at, -1)), "non-negative")


@pytest.mark.parametrize("k", SIZES)
@pytest.mark.parametrize("at, value", [(0, 1), (-1, 0), ("middle", None)])
def test_row_offsets_not_rising_to_the_rows_are_refused_at_any_size(k, at, value):
    rows = np.arange(k + 1, dtype=np.int32)
    if at == "middle":
        at, value = k // 2 + 1, rows[k // 2]  # equal to its predecessor: an empty row range
    refused(result(k, row_offsets=changed(rows, at, value)), "row_offsets must rise")


# ---- body values the reader takes without their checker --------------------------------------


@pytest.mark.parametrize(
    "msg, match",
    [
        (submit(1, model="x" * 9), "SubmitRequest.model: expected a string"),
        (submit(1, output=OutputOptions(rows="x" * 9)), "SubmitRequest.output.rows: expected a"),
        (result(1, timings={"x" * 9: 1.0}), "RequestResult.timings.key: expected a string"),
    ],
    ids=["field", "nested", "map-key"],
)
def test_a_string_over_the_limit_is_refused_though_strings_skip_their_checker(
    monkeypatch, msg, match
):
    monkeypatch.setattr(limits, "MAX_STRING", 8)  # read at each decode, not captured
    refused(msg, match)


@pytest.mark.parametrize(
    "msg, match",
    [
        (submit(1, cid=True), "SubmitRequest.cid: expected an int"),
        (submit(1, timeout_ms=1.5), "SubmitRequest.timeout_ms: float fits none of"),
        (submit(1, output=OutputOptions(normalize=1)), "output.normalize: expected a bool"),
        (result(1, queue_ms=True), "RequestResult.queue_ms: expected a number"),
        (result(1, timings={"a": "1"}), "RequestResult.timings.value: expected a number"),
    ],
    ids=["bool-as-int", "float-as-int", "int-as-bool", "bool-as-float", "str-as-float"],
)
def test_a_value_of_a_neighbouring_type_still_meets_its_checker(msg, match):
    refused(msg, match)


def test_an_int_where_a_float_goes_still_becomes_a_float():
    got = round_trip(result(1, queue_ms=2, timings={"a": 3}))
    assert type(got.queue_ms) is float and type(got.timings["a"]) is float

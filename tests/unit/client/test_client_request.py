"""The front door's one validation: token ids, options, lanes, truncation; models seen."""

from __future__ import annotations

import numpy as np
import pytest

from mesh.client.models import ModelBook
from mesh.client.request import (
    INTERACTIVE_MAX_TOKENS,
    guess_lane,
    lane_for,
    output_options,
    valid_tokenized,
    valid_tokens,
)
from mesh.errors import InvalidInput
from proto_msgs import Lane, ModelInfo, OutputOptions

MODEL = ModelInfo(
    name="tiny", aliases=["org/tiny"], dims=384, max_input_tokens=4, vocab_size=1000,
    pooling="mean", normalize=True, tokenizer_digest="d", workers=1,
)  # fmt: skip
FLOAT = OutputOptions()


def valid(seqs: list[list[int]], truncate: bool = False, lane: int | None = None):
    ids = np.array([t for s in seqs for t in s], dtype=np.int64)
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    return valid_tokens(MODEL, ids, offsets, FLOAT, lane, truncate)


def refused(seqs: list[list[int]]) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        valid(seqs)
    return info.value


def test_valid_ids_are_ready_to_send_as_int32_with_their_lengths() -> None:
    req = valid([[1, 2], [3], [4, 5, 6]])
    assert req.token_ids.dtype == np.int32 and req.offsets.dtype == np.int32
    assert req.token_ids.tolist() == [1, 2, 3, 4, 5, 6] and req.offsets.tolist() == [0, 2, 3, 6]
    assert req.lengths.tolist() == [2, 1, 3] and req.n == 3 and req.tokens == 6
    assert req.model is MODEL and req.lane == Lane.INTERACTIVE


@pytest.mark.parametrize("bad", [-1, 1000, 2**32 + 5, 2**40])
def test_token_ids_outside_the_vocabulary_are_refused_before_any_cast(bad: int) -> None:
    err = refused([[1, 2], [3, bad]])
    assert str(bad) in err.message and "0..999" in err.message and err.param == "input"


def test_too_many_token_ids_are_refused_naming_the_input_and_the_limit() -> None:
    err = refused([[1, 2], [1, 2, 3, 4, 5, 6]])
    assert "input[1] has 6 tokens" in err.message and "more than 4" in err.message
    assert err.param == "input"


def test_an_empty_sequence_is_refused() -> None:
    ids, offsets = np.array([1, 2]), np.array([0, 2, 2])
    with pytest.raises(InvalidInput, match=r"input\[1\] is empty"):
        valid_tokens(MODEL, ids, offsets, FLOAT, None, False)


def test_offsets_that_do_not_cover_the_ids_are_refused() -> None:
    with pytest.raises(InvalidInput, match="offsets"):
        valid_tokens(MODEL, np.array([1, 2, 3]), np.array([0, 2]), FLOAT, None, False)


def test_truncate_keeps_the_first_ids_of_each_sequence_up_to_the_limit() -> None:
    req = valid([[1, 2], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11]], truncate=True)
    assert req.token_ids.tolist() == [1, 2, 1, 2, 3, 4, 7, 8, 9, 10]
    assert req.offsets.tolist() == [0, 2, 6, 10] and req.lengths.tolist() == [2, 4, 4]


def test_dimensions_over_the_width_and_unknown_kinds_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidInput) as info:
        output_options(MODEL, 385, True, "float32")
    assert info.value.param == "dimensions" and "384" in info.value.message
    with pytest.raises(InvalidInput) as info:
        output_options(MODEL, None, True, "float64")
    assert info.value.param == "kind"
    assert output_options(MODEL, 384, False, "binary") == OutputOptions(384, False, "binary")


def test_the_lane_follows_the_size_unless_the_caller_chose() -> None:
    assert lane_for(INTERACTIVE_MAX_TOKENS, None) == Lane.INTERACTIVE
    assert lane_for(INTERACTIVE_MAX_TOKENS + 1, None) == Lane.BATCH
    assert lane_for(10**6, Lane.INTERACTIVE) == Lane.INTERACTIVE
    assert lane_for(1, Lane.BATCH) == Lane.BATCH
    assert guess_lane(["word " * 2000], None) == Lane.BATCH
    assert guess_lane(["a short query"], None) == Lane.INTERACTIVE
    assert guess_lane(["a short query"], Lane.BATCH) == Lane.BATCH


def test_tokenized_requests_get_their_offsets_from_the_lengths() -> None:
    ids = np.arange(5, dtype=np.int32)
    req = valid_tokenized(MODEL, ids, np.array([2, 3], dtype=np.int32), FLOAT, None)
    assert req.offsets.tolist() == [0, 2, 5] and req.lane == Lane.INTERACTIVE


def test_a_model_unserved_for_longer_than_the_window_is_forgotten() -> None:
    book = ModelBook(forget_after_s=60)
    book.note([MODEL], now=0.0)
    assert book.find("org/tiny") is not None and book.names() == ["tiny"]
    book.note([], now=59.0)
    assert book.find("tiny") is not None
    book.note([MODEL], now=100.0)  # served again: the window restarts
    book.note([], now=159.0)
    assert book.find("tiny") is not None
    book.note([], now=161.0)
    assert book.find("tiny") is None and len(book) == 0

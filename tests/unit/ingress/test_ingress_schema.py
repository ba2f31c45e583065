"""Parsing and checking /v1/embeddings bodies: every input shape, every bad shape."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from mesh.ingress.http_errors import ApiError
from mesh.ingress.schema import (
    EmbeddingsRequest,
    check_for_model,
    parse_embeddings_request,
    truncate_tokens,
)

MAX_INPUTS = 8


def parse(doc: object, max_inputs: int = MAX_INPUTS) -> EmbeddingsRequest:
    return parse_embeddings_request(orjson.dumps(doc), max_inputs)


def refused(doc: object, raw: bytes | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_embeddings_request(raw if raw is not None else orjson.dumps(doc), MAX_INPUTS)
    return info.value


def test_a_string_is_one_text_input() -> None:
    req = parse({"model": "m", "input": "hello"})
    assert req.texts == ["hello"] and req.token_ids is None and req.n_inputs == 1
    assert req.encoding_format == "float" and req.dimensions is None


def test_a_list_of_strings_keeps_its_order() -> None:
    req = parse({"model": "m", "input": ["a", "b", "c"], "user": "u-1"})
    assert req.texts == ["a", "b", "c"] and req.n_inputs == 3


def test_a_list_of_ints_is_one_token_sequence() -> None:
    req = parse({"model": "m", "input": [101, 7592, 102]})
    assert req.texts is None
    assert req.token_ids.tolist() == [101, 7592, 102] and req.offsets.tolist() == [0, 3]


def test_a_list_of_int_lists_is_several_sequences() -> None:
    req = parse({"model": "m", "input": [[1, 2], [3], [4, 5, 6]]})
    assert req.token_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert req.offsets.tolist() == [0, 2, 3, 6] and req.n_inputs == 3


@pytest.mark.parametrize("fmt", ["float", "base64", "base64_int8", "base64_binary"])
def test_every_encoding_format_is_accepted(fmt: str) -> None:
    assert parse({"model": "m", "input": "x", "encoding_format": fmt}).encoding_format == fmt


def test_null_optionals_take_their_defaults() -> None:
    req = parse({"model": "m", "input": "x", "encoding_format": None, "dimensions": None})
    assert req.encoding_format == "float" and req.dimensions is None


def test_unknown_fields_are_ignored() -> None:
    assert parse({"model": "m", "input": "x", "extra": {"a": 1}}).texts == ["x"]


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"not json", b'{"model": "m",}', b"\xff\xfe", b'{"input": "x"} trailing']
)
def test_unreadable_json_is_400(raw: bytes) -> None:
    err = refused(None, raw)
    assert err.status == 400 and err.code == "malformed_request"


@pytest.mark.parametrize("doc", [[], ["x"], "x", 3, None])
def test_a_body_that_is_not_an_object_is_400(doc: object) -> None:
    assert refused(doc).status == 400


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": 3, "input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": None}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": ["a", ""]}, "input"),
        ({"model": "m", "input": ["a", 3]}, "input"),
        ({"model": "m", "input": ["a", None]}, "input"),
        ({"model": "m", "input": [1, "a"]}, "input"),
        ({"model": "m", "input": [1, 2.5]}, "input"),
        ({"model": "m", "input": [1, True]}, "input"),
        ({"model": "m", "input": [True]}, "input"),
        ({"model": "m", "input": [1.0]}, "input"),
        ({"model": "m", "input": [[1], []]}, "input"),
        ({"model": "m", "input": [[1], 2]}, "input"),
        ({"model": "m", "input": [[1], ["a"]]}, "input"),
        ({"model": "m", "input": [{"text": "a"}]}, "input"),
        ({"model": "m", "input": {"text": "a"}}, "input"),
        ({"model": "m", "input": 42}, "input"),
        ({"model": "m", "input": [[2**64 - 1]]}, "input"),
        ({"model": "m", "input": "x", "encoding_format": "base32"}, "encoding_format"),
        ({"model": "m", "input": "x", "encoding_format": 1}, "encoding_format"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": -3}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": 3.0}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": "64"}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": True}, "dimensions"),
        ({"model": "m", "input": "x", "user": 7}, "user"),
    ],
)
def test_a_field_that_breaks_the_contract_is_422_naming_it(doc: object, param: str) -> None:
    err = refused(doc)
    assert err.status == 422 and err.code == "invalid_input" and err.param == param
    assert err.type == "invalid_request_error" and err.message


@pytest.mark.parametrize(
    "inputs", [["a"] * (MAX_INPUTS + 1), [[1]] * (MAX_INPUTS + 1)], ids=["texts", "tokens"]
)
def test_more_inputs_than_allowed_is_413(inputs: list[object]) -> None:
    err = refused({"model": "m", "input": inputs})
    assert err.status == 413 and str(MAX_INPUTS) in err.message


def test_exactly_the_most_inputs_allowed_passes() -> None:
    assert parse({"model": "m", "input": ["a"] * MAX_INPUTS}).n_inputs == MAX_INPUTS


# ---- checks that need the model --------------------------------------------------------------


def model_check(req: EmbeddingsRequest, truncate: bool = False) -> None:
    check_for_model(req, model_dims=384, vocab_size=1000, max_tokens=4, truncate=truncate)


def test_dimensions_over_the_models_width_are_422_naming_the_width() -> None:
    req = parse({"model": "m", "input": "x", "dimensions": 385})
    with pytest.raises(ApiError) as info:
        model_check(req)
    assert info.value.status == 422 and info.value.param == "dimensions"
    assert "384" in info.value.message
    model_check(parse({"model": "m", "input": "x", "dimensions": 384}))


@pytest.mark.parametrize("bad", [-1, 1000, 2**40])
def test_token_ids_outside_the_vocabulary_are_422(bad: int) -> None:
    with pytest.raises(ApiError) as info:
        model_check(parse({"model": "m", "input": [[1, 2], [3, bad]]}))
    assert info.value.status == 422 and str(bad) in info.value.message


def test_too_many_token_ids_are_422_naming_the_limit() -> None:
    with pytest.raises(ApiError) as info:
        model_check(parse({"model": "m", "input": [[1, 2], [1, 2, 3, 4, 5, 6]]}))
    assert info.value.status == 422 and "input[1]" in info.value.message
    assert "limit of 4 tokens" in info.value.message


def test_auto_truncate_cuts_token_ids_at_the_limit() -> None:
    req = parse({"model": "m", "input": [[1, 2], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11]]})
    model_check(req, truncate=True)
    assert req.token_ids.tolist() == [1, 2, 1, 2, 3, 4, 7, 8, 9, 10]
    assert req.offsets.tolist() == [0, 2, 6, 10]


def test_truncate_tokens_keeps_short_sequences_whole() -> None:
    ids = np.arange(10)
    offsets = np.array([0, 1, 9, 10])
    new_ids, new_offsets = truncate_tokens(ids, offsets, 3)
    assert new_ids.tolist() == [0, 1, 2, 3, 9] and new_offsets.tolist() == [0, 1, 4, 5]


def test_a_token_id_too_big_for_json_integers_is_422() -> None:
    err = refused(None, b'{"model": "m", "input": [1180591620717411303424]}')
    assert err.status == 422 and err.param == "input"

"""Parsing and checking /v1/embeddings bodies: every input shape, every bad shape."""

from __future__ import annotations

import orjson
import pytest

from mesh.ingress.http_errors import ApiError
from mesh.ingress.schema import EmbeddingsRequest, parse_embeddings_request
from proto_msgs import Lane

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
        ({"model": "m", "input": "x", "priority": "urgent"}, "priority"),
        ({"model": "m", "input": "x", "priority": 0}, "priority"),
        ({"model": "m", "input": "x", "priority": "Interactive"}, "priority"),
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


def test_a_token_id_too_big_for_json_integers_is_422() -> None:
    err = refused(None, b'{"model": "m", "input": [1180591620717411303424]}')
    assert err.status == 422 and err.param == "input"


def test_without_a_priority_the_lane_is_left_to_the_size() -> None:
    assert parse({"model": "m", "input": "x"}).lane is None


@pytest.mark.parametrize(
    ("value", "lane"), [("interactive", Lane.INTERACTIVE), ("batch", Lane.BATCH)]
)
def test_the_priority_field_picks_the_lane(value: str, lane: Lane) -> None:
    assert parse({"model": "m", "input": "x", "priority": value}).lane == lane


def test_the_priority_header_picks_the_lane_and_the_body_wins() -> None:
    body = orjson.dumps({"model": "m", "input": "x"})
    assert parse_embeddings_request(body, MAX_INPUTS, " Batch ").lane == Lane.BATCH
    both = orjson.dumps({"model": "m", "input": "x", "priority": "interactive"})
    assert parse_embeddings_request(both, MAX_INPUTS, "batch").lane == Lane.INTERACTIVE


def test_a_bad_priority_header_is_422_naming_the_header() -> None:
    with pytest.raises(ApiError) as info:
        parse_embeddings_request(orjson.dumps({"model": "m", "input": "x"}), MAX_INPUTS, "soon")
    err = info.value
    assert err.status == 422 and err.param == "X-Embedmesh-Priority"
    assert "interactive, batch" in err.message and "'soon'" in err.message


def test_prompt_name_is_read_for_text_input() -> None:
    assert parse({"model": "m", "input": "hi", "prompt_name": "query"}).prompt_name == "query"
    assert parse({"model": "m", "input": "hi"}).prompt_name is None


@pytest.mark.parametrize("value", [3, "", ["query"], True])
def test_a_prompt_name_that_is_not_a_name_is_422(value: object) -> None:
    err = refused({"model": "m", "input": "hi", "prompt_name": value})
    assert err.status == 422 and err.param == "prompt_name"


@pytest.mark.parametrize("inp", [[1, 2, 3], [[1, 2], [3]]])
def test_a_prompt_name_with_token_ids_is_422(inp: object) -> None:
    err = refused({"model": "m", "input": inp, "prompt_name": "query"})
    assert err.status == 422 and err.param == "prompt_name" and "token ids" in err.message

"""TEI bodies: what parses, what is refused, and with which TEI status and error_type."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from mesh.ingress.http_errors import TEI, ApiError, error_response, tei_status
from mesh.ingress.tei_schema import (
    parse_decode_request,
    parse_embed_request,
    parse_tokenize_request,
)


def body(doc: object) -> bytes:
    return orjson.dumps(doc)


def refused(parse, doc: object, max_inputs: int = 8) -> tuple[int, str, str]:
    with pytest.raises(ApiError) as info:
        parse(body(doc) if not isinstance(doc, bytes) else doc, max_inputs)
    status, error_type = tei_status(info.value)
    return status, error_type, info.value.message


def test_embed_defaults_are_teis() -> None:
    req = parse_embed_request(body({"inputs": "hello"}), 8)
    assert req.inputs.texts == ["hello"]
    assert (req.normalize, req.truncate, req.direction, req.dimensions) == (
        True, None, "right", None,
    )  # fmt: skip


def test_embed_reads_every_option_and_ignores_unknown_fields() -> None:
    req = parse_embed_request(
        body({"inputs": ["a", "b"], "normalize": False, "truncate": True, "dimensions": 4,
              "truncation_direction": "Left", "encoding_format": "float", "extra": 1}),
        8,
    )  # fmt: skip
    assert req.inputs.texts == ["a", "b"] and req.inputs.chars == 2
    assert (req.normalize, req.truncate, req.direction, req.dimensions) == (False, True, "left", 4)


@pytest.mark.parametrize("direction", ["Right", "right", "Left", "left"])
def test_embed_accepts_teis_direction_spellings(direction: str) -> None:
    req = parse_embed_request(body({"inputs": "a", "truncation_direction": direction}), 8)
    assert req.direction == direction.lower()


def test_embed_reads_one_id_list_and_lists_of_ids() -> None:
    one = parse_embed_request(body({"inputs": [101, 7592, 102]}), 8).inputs
    assert one.n == 1 and one.token_ids.tolist() == [101, 7592, 102]
    many = parse_embed_request(body({"inputs": [[101, 102], [101, 7, 102]]}), 8).inputs
    assert many.n == 2 and np.array_equal(many.offsets, [0, 2, 5]) and many.chars == 5


@pytest.mark.parametrize(
    "doc",
    [{"inputs": ""}, {"inputs": []}, {"inputs": ["a", ""]}, {"inputs": [[1], []]}],
)
def test_empty_inputs_are_teis_empty_400(doc: dict) -> None:
    status, error_type, message = refused(parse_embed_request, doc)
    assert (status, error_type) == (400, "Empty") and "cannot be empty" in message


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"inputs": 3},
        {"inputs": ["a", [1, 2]]},
        {"inputs": [1, -2]},
        {"inputs": [[1, 2**32]]},
        {"inputs": [True]},
        {"inputs": "a", "normalize": "yes"},
        {"inputs": "a", "truncate": 1},
        {"inputs": "a", "truncation_direction": "Middle"},
        {"inputs": "a", "dimensions": 0},
        {"inputs": "a", "dimensions": 2.5},
    ],
)
def test_bad_values_are_422_validation(doc: dict) -> None:
    status, error_type, _ = refused(parse_embed_request, doc)
    assert (status, error_type) == (422, "Validation")


def test_prompt_name_is_read_for_texts_and_refused_with_token_ids() -> None:
    assert parse_embed_request(body({"inputs": "a", "prompt_name": "query"}), 8).prompt_name == (
        "query"
    )
    assert parse_embed_request(body({"inputs": "a", "prompt_name": None}), 8).prompt_name is None
    req = parse_tokenize_request(body({"inputs": "a", "prompt_name": "query"}), 8)
    assert req.prompt_name == "query"
    status, error_type, message = refused(parse_embed_request, {"inputs": [1, 2],
                                                                "prompt_name": "query"})  # fmt: skip
    assert (status, error_type) == (422, "Validation") and "text input only" in message
    for parse in (parse_embed_request, parse_tokenize_request):
        assert refused(parse, {"inputs": "a", "prompt_name": ""})[:2] == (422, "Validation")
        assert refused(parse, {"inputs": "a", "prompt_name": 3})[:2] == (422, "Validation")


def test_more_inputs_than_the_client_batch_size_is_413() -> None:
    for parse, doc in [
        (parse_embed_request, {"inputs": ["a"] * 9}),
        (parse_embed_request, {"inputs": [[1]] * 9}),
        (parse_tokenize_request, {"inputs": ["a"] * 9}),
        (parse_decode_request, {"ids": [[1]] * 9}),
    ]:
        status, error_type, message = refused(parse, doc)
        assert (status, error_type) == (413, "Validation")
        assert message == "batch size 9 > maximum allowed batch size 8"


def test_unreadable_bodies_are_400_in_teis_shape() -> None:
    status, error_type, _ = refused(parse_embed_request, b"{nope")
    assert (status, error_type) == (400, "Validation")
    with pytest.raises(ApiError) as info:
        parse_embed_request(b"[1]", 8)
    response = error_response(info.value, TEI)
    assert response.status == 400
    assert orjson.loads(response.body) == {
        "error": "the body must be a JSON object",
        "error_type": "Validation",
    }


def test_tokenize_reads_one_or_many_texts() -> None:
    assert parse_tokenize_request(body({"inputs": "a b"}), 8).texts == ["a b"]
    req = parse_tokenize_request(body({"inputs": ["a", "b"], "add_special_tokens": False}), 8)
    assert req.texts == ["a", "b"] and req.add_special_tokens is False
    assert refused(parse_tokenize_request, {"inputs": [1, 2]})[:2] == (422, "Validation")


def test_decode_reads_one_or_many_id_lists() -> None:
    assert parse_decode_request(body({"ids": [1, 2]}), 8).ids == [[1, 2]]
    req = parse_decode_request(body({"ids": [[1], [2, 3]], "skip_special_tokens": False}), 8)
    assert req.ids == [[1], [2, 3]] and req.skip_special_tokens is False
    assert refused(parse_decode_request, {"ids": []})[:2] == (400, "Empty")
    assert refused(parse_decode_request, {"ids": [[1], []]})[:2] == (400, "Empty")
    assert refused(parse_decode_request, {"ids": [1, "a"]})[:2] == (422, "Validation")
    assert refused(parse_decode_request, {"ids": [[1], 2]})[:2] == (422, "Validation")

"""The cross-encoder routes' bodies: TEI's ``/predict`` inputs read as its untagged enum reads
them (a list of exactly two strings is one pair), ``/rerank``'s and ``/v1/rerank``'s fields,
and each mistake's status (400 not an object or TEI's Empty, 422 a bad value, 413 too many)."""

from __future__ import annotations

import orjson
import pytest

from mesh.ingress.http_errors import ApiError
from mesh.ingress.rerank import parse_v1_rerank_request
from mesh.ingress.tei_schema import parse_predict_request, parse_rerank_request
from proto_msgs import Lane


def _body(doc: object) -> bytes:
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    ("inputs", "expected", "batched"),
    [
        ("one text", ["one text"], False),
        (["query", "passage"], [("query", "passage")], False),
        (["a", "b", "c"], ["a", "b", "c"], True),
        (["a"], ["a"], True),
        ([["q", "p"]], [("q", "p")], True),
        (["t", ["q", "p"]], ["t", ("q", "p")], True),
    ],
)
def test_predict_inputs_read_as_tei_reads_them(inputs, expected, batched) -> None:
    req = parse_predict_request(_body({"inputs": inputs}), 16)
    assert (req.inputs, req.batched, req.raw_scores) == (expected, batched, False)


@pytest.mark.parametrize(
    ("doc", "status"),
    [
        ({"inputs": 3}, 422),
        ({"inputs": [["a", "b", "c"]]}, 422),  # a triple is neither a text nor a pair
        ({"inputs": ""}, 400),
        ({"inputs": ["", ""]}, 400),
        ({"inputs": []}, 400),
        ({"inputs": ["a"] * 17}, 413),
        ({"inputs": "a", "raw_scores": "yes"}, 422),
        ([1], 400),
    ],
)
def test_predict_mistakes_have_their_status(doc: object, status: int) -> None:
    with pytest.raises(ApiError) as err:
        parse_predict_request(_body(doc), 16)
    assert err.value.status == status


def test_rerank_fields_and_mistakes() -> None:
    body = {"query": "q", "texts": ["a", "b"], "return_text": True,
            "truncation_direction": "Left", "truncate": True}  # fmt: skip
    req = parse_rerank_request(_body(body), 16)
    assert (req.query, req.texts, req.return_text, req.direction, req.truncate) == (
        "q", ["a", "b"], True, "left", True,
    )  # fmt: skip
    for doc, status in (
        ({"query": "q", "texts": []}, 400),
        ({"query": "", "texts": [""]}, 400),
        ({"query": 1, "texts": ["a"]}, 422),
        ({"texts": ["a"]}, 422),
        ({"query": "q", "texts": "a"}, 422),
        ({"query": "q", "texts": ["a"] * 17}, 413),
    ):
        with pytest.raises(ApiError) as err:
            parse_rerank_request(_body(doc), 16)
        assert err.value.status == status, doc


def test_v1_rerank_takes_strings_or_text_objects_and_defaults_to_returning_documents() -> None:
    body = {"model": "m", "query": "q", "documents": ["a", {"text": "b"}], "priority": "batch"}
    req = parse_v1_rerank_request(_body(body), 16)
    assert (req.documents, req.top_n, req.return_documents, req.lane) == (
        ["a", "b"], None, True, Lane.BATCH,
    )  # fmt: skip
    req = parse_v1_rerank_request(_body({**body, "priority": None}), 16, "interactive")
    assert req.lane == Lane.INTERACTIVE


def test_v1_rerank_truncates_long_documents_unless_told_not_to() -> None:
    body = {"model": "m", "query": "q", "documents": ["a"]}
    assert parse_v1_rerank_request(_body(body), 16).truncate is True  # as Cohere and Jina
    assert parse_v1_rerank_request(_body({**body, "truncate": False}), 16).truncate is False


@pytest.mark.parametrize(
    ("changes", "status", "param"),
    [
        ({"top_n": 0}, 422, "top_n"),
        ({"top_n": True}, 422, "top_n"),
        ({"documents": []}, 422, "documents"),
        ({"documents": [{"title": "x"}]}, 422, "documents"),
        ({"documents": ["a"] * 17}, 413, "documents"),
        ({"return_documents": "no"}, 422, "return_documents"),
        ({"query": ""}, 422, "query"),
        ({"model": None}, 422, "model"),
        ({"priority": "urgent"}, 422, "priority"),
        ({"truncate": "yes"}, 422, "truncate"),
    ],
)
def test_v1_rerank_mistakes_name_their_field(changes: dict, status: int, param: str) -> None:
    body = {"model": "m", "query": "q", "documents": ["a"], **changes}
    with pytest.raises(ApiError) as err:
        parse_v1_rerank_request(_body(body), 16)
    assert (err.value.status, err.value.param) == (status, param)

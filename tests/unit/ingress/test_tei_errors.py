"""TEI's error mapping: one entry per wire code beside the OpenAI table, TEI's statuses."""

from __future__ import annotations

import orjson

from mesh import errors
from mesh.ingress.http_errors import (
    OPENAI,
    STATUS_BY_CODE,
    TEI,
    TEI_BY_CODE,
    ApiError,
    error_response,
    tei_status,
)
from proto_msgs import ErrorCode

TEI_TYPES = {"Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"}


def test_every_wire_code_has_a_tei_status_and_one_of_teis_types() -> None:
    assert set(TEI_BY_CODE) == set(STATUS_BY_CODE) == set(ErrorCode)
    assert {error_type for _, error_type in TEI_BY_CODE.values()} <= TEI_TYPES


def test_teis_statuses_for_backend_failures_and_model_choice() -> None:
    for exc, expected in [
        (errors.WorkerFailed("x"), (424, "Backend")),
        (errors.ProtocolViolation("x"), (424, "Backend")),
        (errors.ModelNotFound("x"), (422, "Validation")),
        (errors.Overloaded("x"), (429, "Overloaded")),
        (errors.Unavailable("x"), (503, "Unhealthy")),
    ]:
        assert tei_status(ApiError.from_mesh(exc)) == expected


def test_request_level_errors_keep_their_status() -> None:
    assert tei_status(ApiError.malformed("x")) == (400, "Validation")
    assert tei_status(ApiError.unauthorized("x")) == (401, "Validation")
    assert tei_status(ApiError.empty("x")) == (400, "Empty")
    assert tei_status(ApiError(408, "x", code="request_timeout")) == (408, "Validation")


def test_one_error_two_shapes() -> None:
    err = ApiError.from_mesh(errors.Overloaded("busy", retry_after_s=0.2))
    tei = error_response(err, TEI)
    assert tei.status == 429 and tei.headers["Retry-After"] == "1"
    assert orjson.loads(tei.body) == {"error": "busy", "error_type": "Overloaded"}
    openai = error_response(err, OPENAI)
    assert openai.status == 429 and orjson.loads(openai.body)["error"]["code"] == "overloaded"

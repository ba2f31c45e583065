"""The one mapping from mesh errors to HTTP statuses and the OpenAI error shape."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web

from mesh import errors
from mesh.ingress.http_errors import STATUS_BY_CODE, ApiError, error_response, retry_after_header
from proto_msgs import ErrorCode

EXPECTED = [
    (errors.InvalidInput, 422, "invalid_request_error", "invalid_input"),
    (errors.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (errors.TooLarge, 413, "invalid_request_error", "request_too_large"),
    (errors.Overloaded, 429, "rate_limit_error", "overloaded"),
    (errors.Unavailable, 503, "server_error", "unavailable"),
    (errors.DeadlineExceeded, 504, "server_error", "deadline_exceeded"),
    (errors.Cancelled, 499, "invalid_request_error", "cancelled"),
    (errors.WorkerFailed, 502, "server_error", "worker_failed"),
    (errors.InternalError, 500, "server_error", "internal_error"),
    (errors.ProtocolViolation, 502, "server_error", "protocol_error"),
]


def body(response: web.Response) -> dict:
    assert response.content_type == "application/json"
    return orjson.loads(response.body)  # type: ignore[arg-type]


def test_every_wire_error_code_has_a_status() -> None:
    assert set(STATUS_BY_CODE) == set(ErrorCode)


@pytest.mark.parametrize(("cls", "status", "type_", "code"), EXPECTED)
def test_mesh_errors_map_to_their_status_and_shape(
    cls: type[errors.MeshError], status: int, type_: str, code: str
) -> None:
    response = error_response(ApiError.from_mesh(cls("what happened")))
    assert response.status == status
    assert body(response) == {
        "error": {
            "message": "what happened",
            "type": type_,
            "param": "model" if cls is errors.ModelNotFound else None,
            "code": code,
        }
    }


@pytest.mark.parametrize(("retry", "header"), [(None, "1"), (0.1, "1"), (1.0, "1"), (2.2, "3")])
def test_overloaded_carries_a_whole_retry_after_of_at_least_one_second(
    retry: float | None, header: str
) -> None:
    response = error_response(ApiError.from_mesh(errors.Overloaded("busy", retry_after_s=retry)))
    assert response.status == 429 and response.headers["Retry-After"] == header
    assert retry_after_header(retry) == header


def test_unauthorized_asks_for_a_bearer_token() -> None:
    response = error_response(ApiError.unauthorized("no key"))
    assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    assert body(response)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (web.HTTPNotFound(), 404, "not_found"),
        (web.HTTPMethodNotAllowed("GET", ["POST"]), 405, "method_not_allowed"),
        (web.HTTPRequestEntityTooLarge(max_size=1, actual_size=2), 413, "request_too_large"),
    ],
)
def test_aiohttp_errors_are_reshaped(exc: web.HTTPException, status: int, code: str) -> None:
    response = error_response(ApiError.from_http(exc))
    assert response.status == status and body(response)["error"]["code"] == code


def test_local_validation_errors_keep_their_status_and_param() -> None:
    assert ApiError.malformed("x").status == 400
    err = ApiError.invalid("bad", "dimensions")
    assert (err.status, err.param) == (422, "dimensions")
    assert ApiError.too_large("big").status == 413


def test_aiohttps_handle_error_still_has_the_signature_the_json_wrapper_expects() -> None:
    import inspect

    from aiohttp.web_protocol import RequestHandler

    from mesh.ingress.http_errors import answer_unparsable_requests_in_json

    answer_unparsable_requests_in_json()
    assert getattr(RequestHandler.handle_error, "embedmesh_json", False)
    # The wrapper passes these through positionally: a new aiohttp that renames or reorders
    # them must fail here, not turn every unparsable request into a 500.
    original = RequestHandler.handle_error.__wrapped__  # type: ignore[attr-defined]
    assert list(inspect.signature(original).parameters) == [
        "self", "request", "status", "exc", "message",
    ]  # fmt: skip

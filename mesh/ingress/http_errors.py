"""Every error the REST bridge returns: one status table, one JSON shape (OpenAI's).

The rule for client errors:

- **400** the body cannot be read as a JSON object (malformed JSON, not an object, not UTF-8).
- **422** it can, but a field breaks the contract: missing, of the wrong type, empty (an empty
  ``input`` list, an empty string, an empty token list), out of range (``dimensions``, token
  ids), an unknown ``encoding_format``, or an input over the model's token limit (without
  ``--auto-truncate``). As TEI does: the request is well-formed but cannot be processed.
- **413** the request is over a size limit of this server: the body is over
  ``--max-body-bytes``, it has more than ``--max-inputs`` inputs, or it holds more tokens than
  the broker may ever queue for one model.
- **404** unknown model (or route), **401** missing or wrong API key.

Server-side: **429** overloaded (with an integer ``Retry-After`` ≥ 1 s), **503** no worker for
the model or no broker, **504** the request's deadline passed, **502** the mesh failed on this
request (workers kept dying on it, or a malformed reply), **500** a bug.

The body is ``{"error": {"message", "type", "param", "code"}}`` on the OpenAI routes. On TEI's
routes (``POST /``, ``/embed``, ``/tokenize``, ``/decode``, ``/rerank``, ``/predict``,
``GET /info``: route names starting with ``tei.``) it is TEI's ``{"error": "...", "error_type": "..."}``, with TEI's statuses where
TEI has its own (``TEI_BY_CODE``): 422 ``Validation`` for a bad value (an unknown model in the
``X-Embedmesh-Model`` header too), 400 ``Empty`` for empty inputs, 413 ``Validation`` over a
limit, 424 ``Backend`` when the mesh failed on the request, 429 ``Overloaded``, 503
``Unhealthy``. The family follows the route the request matched, so every error of a TEI route
(auth, body, parse, mesh) has TEI's shape; the errors themselves are raised the same way.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from http import HTTPStatus

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from mesh.errors import MeshError
from proto_msgs import ErrorCode

OPENAI = "openai"
TEI = "tei"

log = logging.getLogger("embedmesh.ingress")

CLIENT_CLOSED = 499  # nginx's "client closed request": only ever logged and counted

# Wire error code → (HTTP status, OpenAI error type, error code string). The one mapping.
STATUS_BY_CODE: dict[ErrorCode, tuple[int, str, str]] = {
    ErrorCode.INVALID_INPUT: (422, "invalid_request_error", "invalid_input"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    ErrorCode.TOO_LARGE: (413, "invalid_request_error", "request_too_large"),
    ErrorCode.OVERLOADED: (429, "rate_limit_error", "overloaded"),
    ErrorCode.UNAVAILABLE: (503, "server_error", "unavailable"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "server_error", "deadline_exceeded"),
    ErrorCode.CANCELLED: (CLIENT_CLOSED, "invalid_request_error", "cancelled"),
    ErrorCode.WORKER_FAILED: (502, "server_error", "worker_failed"),
    ErrorCode.INTERNAL: (500, "server_error", "internal_error"),
    ErrorCode.PROTOCOL: (502, "server_error", "protocol_error"),
}
# The same codes on TEI's routes: (HTTP status, TEI's error_type). TEI names five types and
# answers 424 for a backend failure; it has no deadline or model lookup, so those keep the
# HTTP meaning (504) or count as a bad value (the model came from a header or --tei-model).
TEI_BY_CODE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_INPUT: (422, "Validation"),
    ErrorCode.MODEL_NOT_FOUND: (422, "Validation"),
    ErrorCode.TOO_LARGE: (413, "Validation"),
    ErrorCode.OVERLOADED: (429, "Overloaded"),
    ErrorCode.UNAVAILABLE: (503, "Unhealthy"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "Backend"),
    ErrorCode.CANCELLED: (CLIENT_CLOSED, "Backend"),
    ErrorCode.WORKER_FAILED: (424, "Backend"),
    ErrorCode.INTERNAL: (500, "Backend"),
    ErrorCode.PROTOCOL: (424, "Backend"),
}
EMPTY_INPUT = "empty_input"  # the code of TEI's "Empty" errors (400), raised on its routes only
_CODE_BY_NAME = {name: code for code, (_, _, name) in STATUS_BY_CODE.items()}


@dataclass
class ApiError(Exception):
    """An HTTP error response about to be sent."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after_s: float | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    @classmethod
    def malformed(cls, message: str) -> ApiError:
        return cls(400, message, code="malformed_request")

    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> ApiError:
        return cls(422, message, code="invalid_input", param=param)

    @classmethod
    def empty(cls, message: str, param: str | None = None) -> ApiError:
        """TEI's "Empty" error (400): an empty input list, string or id list on a TEI route."""
        return cls(400, message, code=EMPTY_INPUT, param=param)

    @classmethod
    def too_large(cls, message: str, param: str | None = None) -> ApiError:
        return cls(413, message, code="request_too_large", param=param)

    @classmethod
    def unauthorized(cls, message: str) -> ApiError:
        return cls(401, message, code="invalid_api_key")

    @classmethod
    def from_mesh(cls, exc: MeshError, param: str | None = None) -> ApiError:
        status, type_, code = STATUS_BY_CODE.get(exc.code, STATUS_BY_CODE[ErrorCode.INTERNAL])
        if exc.code is ErrorCode.MODEL_NOT_FOUND:
            param = "model"
        param = exc.param or param
        return cls(status, exc.message, type_, code, param, exc.retry_after_s)

    @classmethod
    def from_http(cls, exc: web.HTTPException) -> ApiError:
        """aiohttp's own errors (unknown route, wrong method, body too large) in our shape."""
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        type_ = "invalid_request_error" if exc.status < 500 else "server_error"
        return cls(exc.status, exc.reason, type_, code.get(exc.status, "http_error"))


def retry_after_header(retry_after_s: float | None) -> str:
    """Whole seconds, at least 1 (RFC 9110 delay-seconds is a non-negative integer)."""
    return str(max(1, math.ceil(retry_after_s or 1.0)))


def error_body(err: ApiError) -> dict[str, object]:
    return {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }


def tei_status(err: ApiError) -> tuple[int, str]:
    """(HTTP status, TEI error_type) of an error on a TEI route."""
    code = _CODE_BY_NAME.get(err.code or "")
    if code is not None:
        return TEI_BY_CODE[code]
    if err.code == EMPTY_INPUT:
        return 400, "Empty"
    # The rest are about the HTTP request itself (malformed body, key, route, method, 408).
    return err.status, "Validation" if err.status < 500 else "Backend"


def route_family(request: web.BaseRequest) -> str:
    """TEI for routes registered with a ``tei.`` name, else OpenAI (unmatched routes too)."""
    match_info = getattr(request, "match_info", None)
    name = match_info.route.name if match_info is not None else None
    return TEI if name is not None and name.startswith(f"{TEI}.") else OPENAI


def error_response(err: ApiError, family: str = OPENAI) -> web.Response:
    """The response for ``err`` in its route family's shape."""
    status = err.status
    if family == TEI:
        status, error_type = tei_status(err)
        body: dict[str, object] = {"error": err.message, "error_type": error_type}
    else:
        body = error_body(err)
    headers = {}
    if status == 429 or (status == 503 and err.retry_after_s is not None):
        headers["Retry-After"] = retry_after_header(err.retry_after_s)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return web.Response(
        body=orjson.dumps(body),
        status=status,
        reason=_reason(status),
        content_type="application/json",
        headers=headers,
    )


def _reason(status: int) -> str:
    if status == CLIENT_CLOSED:
        return "Client Closed Request"
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def answer_unparsable_requests_in_json() -> None:
    """Requests aiohttp cannot parse (an HTTP/1.0 POST without Content-Length, a bad header)
    are answered by its protocol handler before any route or middleware runs, in text/plain.
    Wrap that handler once per process so that they get the JSON error shape too."""
    original = RequestHandler.handle_error
    if getattr(original, "embedmesh_json", False):
        return

    def handle_error(
        self: RequestHandler,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not 400 <= status < 500 or request.writer.output_size > 0:
            return original(self, request, status, exc, message)
        log.debug("unparsable request from %s: %s", request.remote, message or exc)
        err = ApiError(status, f"the request is not valid HTTP: {_parse_problem(request, message)}")
        err.code = "malformed_request"
        response = error_response(err)
        response.force_close()  # the stream is out of step: nothing after it can be trusted
        return response

    handle_error.embedmesh_json = True  # type: ignore[attr-defined]
    handle_error.__wrapped__ = original  # type: ignore[attr-defined]  # tests check its signature
    RequestHandler.handle_error = handle_error  # type: ignore[method-assign]


def _parse_problem(request: web.BaseRequest, message: str | None) -> str:
    text = (message or "unreadable request").strip()
    if "Connection: close" in text:
        # The parser's words for a body sent without a length on a connection that ends
        # after the request: HTTP/1.0 has no chunked encoding, so the length is required.
        return "a request body needs a Content-Length header (HTTP/1.0 has no chunked bodies)"
    return text

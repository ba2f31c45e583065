"""Typed errors a caller of the mesh sees; each wraps one wire ``ErrorCode``.

Per-request errors (recoverable by the caller) all derive from ``MeshError``. They are raised by
``mesh.client`` from RequestError messages and local checks, and mapped to HTTP statuses in one
place (``mesh.ingress.http_errors``).
"""

from __future__ import annotations

from proto_msgs import ErrorCode


class MeshError(Exception):
    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        # The request field at fault ("input", "dimensions", ...), for the HTTP error's
        # ``param``: the client validates, the ingress only maps, so the field travels here.
        self.param = param


class InvalidInput(MeshError):
    code = ErrorCode.INVALID_INPUT


class ModelNotFound(MeshError):
    code = ErrorCode.MODEL_NOT_FOUND


class TooLarge(MeshError):
    code = ErrorCode.TOO_LARGE


class Overloaded(MeshError):
    code = ErrorCode.OVERLOADED


class Unavailable(MeshError):
    code = ErrorCode.UNAVAILABLE


class DeadlineExceeded(MeshError):
    code = ErrorCode.DEADLINE_EXCEEDED


class Cancelled(MeshError):
    code = ErrorCode.CANCELLED


class WorkerFailed(MeshError):
    code = ErrorCode.WORKER_FAILED


class InternalError(MeshError):
    code = ErrorCode.INTERNAL


class ProtocolViolation(MeshError):
    code = ErrorCode.PROTOCOL


_BY_CODE: dict[ErrorCode, type[MeshError]] = {
    cls.code: cls
    for cls in (
        InvalidInput,
        ModelNotFound,
        TooLarge,
        Overloaded,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        WorkerFailed,
        InternalError,
        ProtocolViolation,
    )
}


def error_from_code(code: int, message: str, retry_after_s: float | None = None) -> MeshError:
    """The typed exception for a wire error code (unknown codes become InternalError)."""
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except ValueError:
        cls = InternalError
    return cls(message, retry_after_s=retry_after_s)

"""Error codes shared on the wire, and the one exception type decoding raises.

Errors travel as data (an ``ErrorCode`` plus a message) and are re-raised as typed exceptions
where they are consumed (``mesh.errors``); the HTTP status of each code is decided in one place,
``mesh.ingress.http_errors``.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Why a request (or a batch) ended without a result."""

    INVALID_INPUT = 1  # the request itself is wrong: fix it and retry
    MODEL_NOT_FOUND = 2  # no model of that name or alias in the catalog
    TOO_LARGE = 3  # over a size limit (inputs, tokens, bytes)
    OVERLOADED = 4  # admission refused: queue full; retry after retry_after_ms
    UNAVAILABLE = 5  # no worker for the model, or the broker is gone
    DEADLINE_EXCEEDED = 6  # the request's deadline passed before it finished
    CANCELLED = 7  # the client cancelled it
    WORKER_FAILED = 8  # workers kept dying on this work (attempt cap reached)
    INTERNAL = 9  # a bug or an engine failure
    PROTOCOL = 10  # a malformed message that still carried a correlation id


class ProtocolError(Exception):
    """Any frame list that is not a valid message of this protocol version.

    Servers count it, log it once per peer and drop the message; when ``cid`` could be read the
    sender is answered with an ``ErrorCode.PROTOCOL`` error. It never kills a process.
    """

    def __init__(self, reason: str, cid: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cid = cid

"""The objects of OpenAI's Files and Batches API, as the job store keeps them.

Field names and states are OpenAI's, so the HTTP routes can hand ``to_openai()`` to a JSON
encoder unchanged; what embedmesh adds (tokens done / total) rides along as extra fields that
OpenAI's clients ignore.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class BatchStatus(StrEnum):
    """OpenAI's batch states; the last five are terminal except ``cancelling``."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.CANCELLED, BatchStatus.EXPIRED}
)

# The timestamp column a batch gets when it enters each state (OpenAI's ``*_at`` fields).
STATUS_TIMESTAMP: dict[BatchStatus, str] = {
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
    BatchStatus.EXPIRED: "expired_at",
}


class FilePurpose(StrEnum):
    """Purposes a file of this server can have: uploaded for a batch, or written by one."""

    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class FileObject:
    """One stored file: an uploaded batch input, or a batch's output or error file."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": self.status,
        }


@dataclass(frozen=True, slots=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class BatchError:
    """One entry of a batch's ``errors.data`` (OpenAI's shape)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch as OpenAI describes it, plus ``tokens_done`` / ``tokens_total`` (ours)."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    expired_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    errors: tuple[BatchError, ...] = ()
    tokens_done: int = 0
    tokens_total: int = 0

    def rate_and_eta(self, now: float) -> tuple[float, float | None]:
        """Tokens per second since the batch started, and seconds left at that rate (None
        while unknown: not started, nothing done yet, or no token total)."""
        if self.in_progress_at is None or self.tokens_done <= 0:
            return 0.0, None
        end = next((t for t in (self.completed_at, self.cancelled_at, self.expired_at) if t), now)
        rate = self.tokens_done / max(end - self.in_progress_at, 1e-3)
        left = max(self.tokens_total - self.tokens_done, 0)
        return rate, (left / rate if self.tokens_total and not self.status.terminal else None)

    def to_openai(self) -> dict[str, Any]:
        counts = self.request_counts
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": (
                {"object": "list", "data": [e.to_openai() for e in self.errors]}
                if self.errors
                else None
            ),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": str(self.status),
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {
                "total": counts.total,
                "completed": counts.completed,
                "failed": counts.failed,
            },
            "metadata": self.metadata,
            "tokens_done": self.tokens_done,
            "tokens_total": self.tokens_total,
        }


def window_seconds(completion_window: str) -> int:
    """``"24h"`` -> 86400. OpenAI accepts only ``24h``; any ``<n>h`` / ``<n>m`` is taken here."""
    text = completion_window.strip()
    units = {"h": 3600, "m": 60, "s": 1}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise ValueError(f"completion_window must look like '24h', not {completion_window!r}")
    return int(text[:-1]) * units[text[-1]]

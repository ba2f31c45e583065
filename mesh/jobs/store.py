"""The job store's interface: files, batches, and the leases that carry a batch's work.

Two implementations keep the same semantics: ``SqliteJobStore`` (one host, several
processes) and ``PostgresJobStore`` (a fleet on one shared database). File contents and output
parts are blobs on disk (``BlobStore``: the state directory, or a volume every host mounts);
the database holds metadata, progress, leases and one result row per finished input line.

A batch's life: ``create_batch`` (validating); a validator (``claim_validation``, leased
too) reads the file and calls ``start_batch``, which cuts the input into chunks
(in_progress), or ``fail_batch`` (failed). Any process then loops ``claim_chunk`` ->
``read_chunk`` -> ``renew`` while it works (its ``cancel_requested`` says stop, then
``release_chunk``) -> ``complete_chunk`` (the chunk's results, its done-mark and the counts
in one transaction), or ``fail_chunk``. A lease that is not renewed expires and the chunk goes
to the next claimer, so a batch whose owner died is resumed by another process. When nothing
is left, ``finalize`` (called by the commit of the last chunk, and safe to call anytime)
writes the output and error files from the committed rows in line order: each input line
appears exactly once. A runner's idle loop calls ``finalize`` on ``unfinished_batches``,
``expire`` and ``purge`` now and then, so cancels, windows and retention take effect with no
chunk to commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Generic, Protocol, TypeVar, runtime_checkable

from mesh.jobs.objects import Batch, BatchError, FileObject

# How long a claimed chunk stays its owner's without a renewal. A runner renews every third of
# it; 10..120 s is reasonable (shorter: a GC pause loses work; longer: a dead owner's chunk
# waits that long before another process resumes it).
DEFAULT_LEASE_S = 30.0
# Whole-chunk failures (fail_chunk) before a chunk's lines are counted as failed; 2..5.
MAX_CHUNK_ATTEMPTS = 3
# Input lines per chunk: the unit of a lease and of a retry; 100..10,000 is reasonable.
DEFAULT_CHUNK_LINES = 1000
# A batch's output and error files are deleted this long after the batch ends (OpenAI keeps
# them 30 days); uploaded input files stay until deleted.
OUTPUT_RETENTION_S = 30 * 24 * 3600

T = TypeVar("T")


class JobStoreError(Exception):
    """Base of the store's errors."""


class NotFound(JobStoreError):
    """No file or batch of that id."""


class Conflict(JobStoreError):
    """The object is not in a state that allows the operation (e.g. cancel a finished batch)."""


class LeaseLost(JobStoreError):
    """The lease expired and another process claimed the chunk, or the batch ended."""


class TooLarge(JobStoreError):
    """A file is over the size limit given to ``create_file``."""


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """Input lines ``[first_line, end_line)`` at bytes ``[byte_start, byte_end)`` of the file."""

    first_line: int
    end_line: int
    byte_start: int
    byte_end: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed chunk. ``attempt`` tells this claim from a later one of the same chunk."""

    batch_id: str
    chunk_no: int
    input_file_id: str
    span: ChunkSpan
    owner: str
    attempt: int
    expires_at: float
    cancel_requested: bool = False


@dataclass(frozen=True, slots=True)
class LineResult:
    """One input line's outcome: an output line, or an error line (one JSON object, no newline)."""

    line_no: int
    custom_id: str
    output: bytes | None = None
    error: bytes | None = None
    tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """A list page: OpenAI's ``{data, first_id, last_id, has_more}``."""

    data: list[T] = field(default_factory=list)
    has_more: bool = False

    def to_openai(self) -> dict[str, Any]:
        items = [item.to_openai() for item in self.data]  # type: ignore[attr-defined]
        return {
            "object": "list",
            "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
            "has_more": self.has_more,
        }


@runtime_checkable
class JobStore(Protocol):
    """What the Files and Batches routes and the batch runner need from a store."""

    # Files.
    def create_file(
        self,
        content: BinaryIO | bytes,
        *,
        filename: str,
        purpose: str,
        max_bytes: int | None = None,
    ) -> FileObject: ...
    def get_file(self, file_id: str) -> FileObject: ...
    def list_files(
        self, *, purpose: str | None = None, limit: int = 20, after: str | None = None
    ) -> Page[FileObject]: ...
    def open_file(self, file_id: str) -> BinaryIO: ...
    def delete_file(self, file_id: str) -> None: ...
    def stored_bytes(self) -> int: ...
    def plan_chunks(
        self, file_id: str, lines_per_chunk: int = DEFAULT_CHUNK_LINES
    ) -> list[ChunkSpan]: ...
    def read_chunk(self, lease: Lease) -> list[bytes]: ...

    # Batches.
    def create_batch(
        self,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
    ) -> Batch: ...
    def start_batch(
        self, batch_id: str, chunks: Sequence[ChunkSpan], *, tokens_total: int = 0
    ) -> Batch: ...
    def claim_validation(self, owner: str, *, lease_s: float = DEFAULT_LEASE_S) -> Batch | None: ...
    def renew_validation(
        self, batch_id: str, owner: str, *, lease_s: float = DEFAULT_LEASE_S
    ) -> None: ...
    def fail_batch(self, batch_id: str, errors: Sequence[BatchError]) -> Batch: ...
    def get_batch(self, batch_id: str) -> Batch: ...
    def list_batches(self, *, limit: int = 20, after: str | None = None) -> Page[Batch]: ...
    def cancel_batch(self, batch_id: str) -> Batch: ...

    # Work.
    def claim_chunk(self, owner: str, *, lease_s: float = DEFAULT_LEASE_S) -> Lease | None: ...
    def renew(self, lease: Lease, *, lease_s: float = DEFAULT_LEASE_S) -> Lease: ...
    def complete_chunk(self, lease: Lease, results: Iterable[LineResult]) -> None: ...
    def fail_chunk(self, lease: Lease, message: str) -> None: ...
    def release_chunk(self, lease: Lease) -> None: ...
    def release_owner(self, owner: str) -> int: ...
    def finalize(self, batch_id: str) -> Batch: ...
    def unfinished_batches(self) -> list[str]: ...
    def expire(self) -> list[str]: ...
    def purge(self) -> list[str]: ...
    def close(self) -> None: ...

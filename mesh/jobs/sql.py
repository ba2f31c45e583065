"""The store's files and batches in SQL that SQLite and PostgreSQL both speak.

Subclasses give a connection and a write transaction (``_tx``); everything else is here once,
so the two stores cannot drift apart. Statements are written with ``?`` placeholders; a dialect
whose driver wants ``%s`` sets ``placeholder``. ``row_lock`` is appended to a SELECT of a row the
transaction will rewrite (PostgreSQL's ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already
holds the one write lock).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from typing import Any, BinaryIO

from mesh.jobs.blobs import BlobStore
from mesh.jobs.objects import (
    STATUS_TIMESTAMP,
    Batch,
    BatchError,
    BatchStatus,
    FileObject,
    FilePurpose,
    RequestCounts,
    new_batch_id,
    new_file_id,
    window_seconds,
)
from mesh.jobs.store import (
    DEFAULT_CHUNK_LINES,
    DEFAULT_LEASE_S,
    MAX_CHUNK_ATTEMPTS,
    OUTPUT_RETENTION_S,
    ChunkSpan,
    Conflict,
    Lease,
    LeaseLost,
    NotFound,
    Page,
)

Row = Any  # sqlite3.Row or psycopg's dict row: both index by column name
MAX_PAGE = 100  # OpenAI's list limit is 1..100

BATCH_COLUMNS = (
    "id, endpoint, input_file_id, completion_window, status, created_at, expires_at,"
    " in_progress_at, finalizing_at, completed_at, failed_at, cancelling_at, cancelled_at,"
    " expired_at, output_file_id, error_file_id, total, completed, failed, tokens_done,"
    " tokens_total, metadata, errors"
)
FILE_COLUMNS = "id, bytes, created_at, filename, purpose, status, expires_at"
LIVE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING)


class Tx:
    """One transaction's cursor; ``q`` runs a statement written with ``?`` placeholders."""

    def __init__(self, cursor: Any, placeholder: str) -> None:
        self.cursor = cursor
        self.placeholder = placeholder

    def q(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        return self.cursor.execute(sql, _plain(params))

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        self.cursor.executemany(sql, [_plain(r) for r in rows])

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return self.q(sql, params).fetchone()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.q(sql, params).fetchone()
        return None if row is None else row[0]


class SqlStore:
    """Files and batches; the work on them (leases, finalize) is added by ``SqlJobStore``."""

    placeholder = "?"
    row_lock = ""

    def __init__(
        self,
        blobs: BlobStore,
        *,
        clock: Callable[[], float] = time.time,
        output_retention_s: float = OUTPUT_RETENTION_S,
        max_chunk_attempts: int = MAX_CHUNK_ATTEMPTS,
    ) -> None:
        self.blobs = blobs
        self.clock = clock
        self.output_retention_s = output_retention_s
        self.max_chunk_attempts = max_chunk_attempts

    def finalize(self, batch_id: str) -> Batch:
        raise NotImplementedError

    def _tx(self, *, write: bool = True) -> AbstractContextManager[Tx]:
        """A transaction; ``write`` ones are serialized with every other writer."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # Files.

    def create_file(
        self,
        content: BinaryIO | bytes,
        *,
        filename: str,
        purpose: str,
        max_bytes: int | None = None,
    ) -> FileObject:
        file_id = new_file_id()
        size = self.blobs.write(f"files/{file_id}", content, max_bytes=max_bytes)
        try:
            return self._insert_file(file_id, size, filename, purpose)
        except BaseException:
            self.blobs.delete(f"files/{file_id}")
            raise

    def _insert_file(
        self, file_id: str, size: int, filename: str, purpose: str, tx: Tx | None = None
    ) -> FileObject:
        now = int(self.clock())
        expires = (
            int(now + self.output_retention_s) if purpose == FilePurpose.BATCH_OUTPUT else None
        )
        record = FileObject(file_id, size, now, filename, purpose, "processed", expires)
        sql = f"INSERT INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
        params = (file_id, size, now, filename, purpose, record.status, expires)
        if tx is not None:
            tx.q(sql, params)
        else:
            with self._tx() as fresh:
                fresh.q(sql, params)
        return record

    def get_file(self, file_id: str) -> FileObject:
        with self._tx(write=False) as tx:
            row = tx.one(f"SELECT {FILE_COLUMNS} FROM files WHERE id = ?", (file_id,))
        if row is None:
            raise NotFound(f"no file {file_id!r}")
        return _file(row)

    def list_files(
        self, *, purpose: str | None = None, limit: int = 20, after: str | None = None
    ) -> Page[FileObject]:
        where, params = ("purpose = ?", [purpose]) if purpose else ("1 = 1", [])
        rows = self._page("files", FILE_COLUMNS, where, params, limit, after)
        return Page([_file(r) for r in rows[:limit]], len(rows) > limit)

    def open_file(self, file_id: str) -> BinaryIO:
        self.get_file(file_id)
        return self.blobs.open(f"files/{file_id}")

    def plan_chunks(
        self, file_id: str, lines_per_chunk: int = DEFAULT_CHUNK_LINES
    ) -> list[ChunkSpan]:
        """Cut an uploaded file into chunks of ``lines_per_chunk`` lines (for ``start_batch``)."""
        self.get_file(file_id)
        return self.blobs.plan_chunks(f"files/{file_id}", lines_per_chunk)

    def read_chunk(self, lease: Lease) -> list[bytes]:
        """The input lines of a claimed chunk, without their newlines."""
        return self.blobs.read_span(f"files/{lease.input_file_id}", lease.span)

    def delete_file(self, file_id: str) -> None:
        """Delete a file; refused (Conflict) while an unfinished batch reads it as its input."""
        with self._tx() as tx:
            # Delete, then look: the row lock the DELETE takes orders this against a
            # create_batch reading the file (raising rolls the DELETE back).
            if tx.q("DELETE FROM files WHERE id = ?", (file_id,)).rowcount == 0:
                raise NotFound(f"no file {file_id!r}")
            busy = tx.scalar(
                "SELECT COUNT(*) FROM batches WHERE input_file_id = ? AND status IN (?, ?, ?, ?)",
                (file_id, *LIVE, BatchStatus.CANCELLING),
            )
            if busy:
                raise Conflict(f"file {file_id!r} is the input of an unfinished batch")
        self.blobs.delete(f"files/{file_id}")

    def stored_bytes(self) -> int:
        """The bytes of every stored file: what a disk limit is checked against."""
        with self._tx(write=False) as tx:
            return int(tx.scalar("SELECT COALESCE(SUM(bytes), 0) FROM files"))

    def purge(self) -> list[str]:
        """Delete the files whose retention has passed; returns their ids."""
        with self._tx() as tx:
            rows = tx.q(
                "SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?",
                (int(self.clock()),),
            ).fetchall()
            ids = [r[0] for r in rows]
            for file_id in ids:
                tx.q("DELETE FROM files WHERE id = ?", (file_id,))
        for file_id in ids:
            self.blobs.delete(f"files/{file_id}")
        return ids

    # Batches.

    def create_batch(
        self,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
    ) -> Batch:
        window = window_seconds(completion_window)
        batch_id, now = new_batch_id(), int(self.clock())
        with self._tx() as tx:
            purpose = tx.scalar(
                "SELECT purpose FROM files WHERE id = ?" + self.row_lock, (input_file_id,)
            )
            if purpose is None:
                raise NotFound(f"no file {input_file_id!r}")
            if purpose != FilePurpose.BATCH:
                raise Conflict(f"file {input_file_id!r} has purpose {purpose!r}, not 'batch'")
            tx.q(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status,"
                " created_at, expires_at, metadata, errors) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    batch_id,
                    endpoint,
                    input_file_id,
                    completion_window,
                    BatchStatus.VALIDATING,
                    now,
                    now + window,
                    json.dumps(metadata) if metadata is not None else None,
                    "[]",
                ),
            )
            return self._batch(tx, batch_id)

    def claim_validation(self, owner: str, *, lease_s: float = DEFAULT_LEASE_S) -> Batch | None:
        """Take a validating batch nobody is validating (or whose validator died)."""
        now = self.clock()
        with self._tx() as tx:
            row = tx.one(
                "SELECT id FROM batches WHERE status = ? AND"
                " (owner IS NULL OR lease_expires_at <= ?) ORDER BY seq LIMIT 1"
                + self.claim_lock("batches"),
                (BatchStatus.VALIDATING, now),
            )
            if row is None:
                return None
            tx.q(
                "UPDATE batches SET owner = ?, lease_expires_at = ? WHERE id = ?",
                (owner, now + lease_s, row[0]),
            )
            return self._batch(tx, row[0])

    def renew_validation(
        self, batch_id: str, owner: str, *, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        """Extend ``owner``'s lease on a batch it validates (a large file takes a while);
        LeaseLost when another process took it over or the batch is not validating any more
        (cancelled, expired)."""
        with self._tx() as tx:
            changed = tx.q(
                "UPDATE batches SET lease_expires_at = ? WHERE id = ? AND owner = ? AND status = ?",
                (self.clock() + lease_s, batch_id, owner, BatchStatus.VALIDATING),
            ).rowcount
        if changed != 1:
            raise LeaseLost(f"batch {batch_id!r} is no longer validated by {owner!r}")

    def lock_of(self, table: str) -> str:
        """What makes a SELECT lock the rows of ``table`` it returns until the commit."""
        return ""

    def claim_lock(self, table: str) -> str:
        """What makes a claiming SELECT lock its row and skip rows another claim holds."""
        return ""

    def start_batch(
        self, batch_id: str, chunks: Sequence[ChunkSpan], *, tokens_total: int = 0
    ) -> Batch:
        """Validated: cut the work into ``chunks`` and run it (validating -> in_progress)."""
        with self._tx() as tx:
            self._lock_validating(tx, batch_id)
            tx.many(
                "INSERT INTO chunks (batch_id, chunk_no, first_line, end_line, byte_start,"
                " byte_end) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (batch_id, n, c.first_line, c.end_line, c.byte_start, c.byte_end)
                    for n, c in enumerate(chunks)
                ],
            )
            total = sum(c.end_line - c.first_line for c in chunks)
            tx.q(
                "UPDATE batches SET status = ?, in_progress_at = ?, total = ?, tokens_total = ?,"
                " owner = NULL, lease_expires_at = NULL WHERE id = ?",
                (BatchStatus.IN_PROGRESS, int(self.clock()), total, tokens_total, batch_id),
            )
            started = self._batch(tx, batch_id)
        # No lines: nothing will ever complete a chunk of it, so it ends here.
        return started if chunks else self.finalize(batch_id)

    def _lock_validating(self, tx: Tx, batch_id: str) -> None:
        """Lock the batch's row; Conflict unless it is still validating."""
        batch = self._batch(tx, batch_id, lock=True)
        if batch.status != BatchStatus.VALIDATING:
            raise Conflict(f"batch {batch_id!r} is {batch.status}, not validating")

    def fail_batch(self, batch_id: str, errors: Sequence[BatchError]) -> Batch:
        """Validation failed (validating -> failed), with OpenAI's ``errors`` list."""
        with self._tx() as tx:
            self._lock_validating(tx, batch_id)
            tx.q(
                "UPDATE batches SET status = ?, failed_at = ?, errors = ?, owner = NULL,"
                " lease_expires_at = NULL WHERE id = ?",
                (BatchStatus.FAILED, int(self.clock()), errors_json(errors), batch_id),
            )
            return self._batch(tx, batch_id)

    def get_batch(self, batch_id: str) -> Batch:
        with self._tx(write=False) as tx:
            return self._batch(tx, batch_id)

    def list_batches(self, *, limit: int = 20, after: str | None = None) -> Page[Batch]:
        rows = self._page("batches", BATCH_COLUMNS, "1 = 1", [], limit, after)
        return Page([_batch(r) for r in rows[:limit]], len(rows) > limit)

    def unfinished_batches(self) -> list[str]:
        """Ids of the batches not yet in a terminal state, oldest first."""
        with self._tx(write=False) as tx:
            rows = tx.q(
                "SELECT id FROM batches WHERE status IN (?, ?, ?, ?) ORDER BY seq",
                (*LIVE, BatchStatus.CANCELLING),
            ).fetchall()
        return [r[0] for r in rows]

    def _set_status(self, tx: Tx, batch_id: str, status: BatchStatus) -> None:
        tx.q(
            f"UPDATE batches SET status = ?, {STATUS_TIMESTAMP[status]} = ? WHERE id = ?",
            (status, int(self.clock()), batch_id),
        )

    def _batch(self, tx: Tx, batch_id: str, *, lock: bool = False) -> Batch:
        suffix = self.row_lock if lock else ""
        row = tx.one(f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?{suffix}", (batch_id,))
        if row is None:
            raise NotFound(f"no batch {batch_id!r}")
        return _batch(row)

    def _page(
        self, table: str, columns: str, where: str, params: list[Any], limit: int, after: str | None
    ) -> list[Row]:
        """Newest first; ``after`` is the id of the last object of the previous page."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
        with self._tx(write=False) as tx:
            if after is not None:
                seq = tx.scalar(f"SELECT seq FROM {table} WHERE id = ?", (after,))
                if seq is None:
                    raise NotFound(f"no object {after!r} to list after")
                where, params = f"{where} AND seq < ?", [*params, seq]
            return tx.q(
                f"SELECT {columns} FROM {table} WHERE {where} ORDER BY seq DESC LIMIT ?",
                (*params, limit + 1),
            ).fetchall()


def _plain(params: Sequence[Any]) -> tuple[Any, ...]:
    """Enum members as their values: each driver adapts enums its own way."""
    return tuple(p.value if isinstance(p, Enum) else p for p in params)


def _file(row: Row) -> FileObject:
    return FileObject(
        row["id"],
        row["bytes"],
        row["created_at"],
        row["filename"],
        row["purpose"],
        row["status"],
        row["expires_at"],
    )


def _batch(row: Row) -> Batch:
    times = {name: row[name] for name in STATUS_TIMESTAMP.values()}
    return Batch(
        id=row["id"],
        endpoint=row["endpoint"],
        input_file_id=row["input_file_id"],
        completion_window=row["completion_window"],
        status=BatchStatus(row["status"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        request_counts=RequestCounts(row["total"], row["completed"], row["failed"]),
        metadata=json.loads(row["metadata"]) if row["metadata"] else None,
        errors=tuple(BatchError(**e) for e in json.loads(row["errors"] or "[]")),
        tokens_done=row["tokens_done"],
        tokens_total=row["tokens_total"],
        **times,
    )


def errors_json(errors: Sequence[BatchError]) -> str:
    return json.dumps([e.to_openai() for e in errors])

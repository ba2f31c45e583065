"""A batch's work in SQL: leases on chunks, their results, cancel, expiry and finalize.

Exactly once: a chunk's result rows (one per input line, keyed ``(batch_id, line_no)``) are
inserted in the same transaction that checks the lease is still this claim's and marks the
chunk done, so a chunk retried after its first owner died is committed by one claim only; the
output file is assembled from the committed rows, in line order, when the batch ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from mesh.jobs.objects import Batch, BatchError, BatchStatus, FilePurpose, new_file_id
from mesh.jobs.sql import LIVE, Row, SqlStore, Tx, errors_json
from mesh.jobs.store import (
    DEFAULT_LEASE_S,
    ChunkSpan,
    Conflict,
    JobStoreError,
    Lease,
    LeaseLost,
    LineResult,
)

PENDING, DONE, FAILED = "pending", "done", "failed"
ROWS_PER_READ = 5000  # result rows read per query while assembling an output file
FINALIZE_TRIES = 5  # a chunk committed while an expired batch is assembled makes it go again


@dataclass(frozen=True, slots=True)
class _Assembled:
    rows: int
    output: tuple[str, int] | None  # (file id, bytes)
    error: tuple[str, int] | None


class SqlJobStore(SqlStore):
    """The whole ``JobStore``: files and batches (``SqlStore``) and the work on them."""

    # Driver exceptions that mean a unique key refused a row (set by each dialect).
    integrity_errors: tuple[type[Exception], ...] = ()

    def cancel_batch(self, batch_id: str) -> Batch:
        """validating / in_progress -> cancelling; cancelled as soon as no lease is live."""
        with self._tx() as tx:
            batch = self._batch(tx, batch_id, lock=True)
            if batch.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
                self._set_status(tx, batch_id, BatchStatus.CANCELLING)
            elif batch.status != BatchStatus.CANCELLING:
                raise Conflict(f"batch {batch_id!r} is {batch.status}: it cannot be cancelled")
        return self.finalize(batch_id)

    def claim_chunk(self, owner: str, *, lease_s: float = DEFAULT_LEASE_S) -> Lease | None:
        """Lease the oldest running batch's first free chunk (free: never claimed, or expired)."""
        now = self.clock()
        with self._tx() as tx:
            row = tx.one(
                "SELECT c.batch_id, c.chunk_no, c.first_line, c.end_line, c.byte_start,"
                " c.byte_end, c.attempt, b.input_file_id FROM chunks c"
                " JOIN batches b ON b.id = c.batch_id"
                " WHERE b.status = ? AND b.expires_at > ? AND c.state = ?"
                " AND (c.owner IS NULL OR c.lease_expires_at <= ?)"
                " ORDER BY b.seq, c.chunk_no LIMIT 1" + self.claim_lock("c"),
                (BatchStatus.IN_PROGRESS, now, PENDING, now),
            )
            if row is None:
                return None
            attempt = row["attempt"] + 1
            tx.q(
                "UPDATE chunks SET owner = ?, attempt = ?, lease_expires_at = ?"
                " WHERE batch_id = ? AND chunk_no = ?",
                (owner, attempt, now + lease_s, row["batch_id"], row["chunk_no"]),
            )
        span = ChunkSpan(row["first_line"], row["end_line"], row["byte_start"], row["byte_end"])
        return Lease(
            row["batch_id"], row["chunk_no"], row["input_file_id"], span, owner, attempt,
            now + lease_s,
        )  # fmt: skip

    def renew(self, lease: Lease, *, lease_s: float = DEFAULT_LEASE_S) -> Lease:
        """Extend a lease; ``cancel_requested`` on the result says to stop (cancel, expiry)."""
        now = self.clock()
        with self._tx() as tx:
            self._check_lease(tx, lease)
            row = tx.one("SELECT status, expires_at FROM batches WHERE id = ?", (lease.batch_id,))
            tx.q(
                "UPDATE chunks SET lease_expires_at = ? WHERE batch_id = ? AND chunk_no = ?",
                (now + lease_s, lease.batch_id, lease.chunk_no),
            )
        stop = row["status"] == BatchStatus.CANCELLING or now >= row["expires_at"]
        return dataclasses.replace(lease, expires_at=now + lease_s, cancel_requested=stop)

    def complete_chunk(self, lease: Lease, results: Iterable[LineResult]) -> None:
        """Commit a chunk: its result rows, its done-mark and the batch's counts, atomically.

        ``results`` holds exactly one entry per line of the chunk. Raises ``LeaseLost`` (and
        commits nothing) when another claim owns the chunk now or the batch has ended; a lease
        past its expiry still commits while no other process has claimed the chunk since. The
        batch is finalized here when this was its last chunk.
        """
        rows = sorted(results, key=lambda r: r.line_no)
        if [r.line_no for r in rows] != list(range(lease.span.first_line, lease.span.end_line)):
            raise ValueError("complete_chunk needs one result for every line of the chunk")
        part = f"parts/{lease.batch_id}/{lease.chunk_no}.{lease.attempt}"
        placed = self._write_part(part, lease.batch_id, rows)
        try:
            with self._tx() as tx:
                self._check_lease(tx, lease)
                tx.many(
                    "INSERT INTO results (batch_id, line_no, custom_id, ok, part, part_offset,"
                    " part_length) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    placed,
                )
                self._end_chunk(tx, lease, DONE)
                tx.q(
                    "UPDATE batches SET completed = completed + ?, failed = failed + ?,"
                    " tokens_done = tokens_done + ? WHERE id = ?",
                    (
                        sum(r.ok for r in rows),
                        sum(not r.ok for r in rows),
                        sum(r.tokens for r in rows),
                        lease.batch_id,
                    ),
                )
        except self.integrity_errors as exc:
            self.blobs.delete(part)
            raise LeaseLost(f"chunk {lease.chunk_no} of {lease.batch_id} was committed") from exc
        except BaseException:
            self.blobs.delete(part)
            raise
        self.finalize(lease.batch_id)

    def fail_chunk(self, lease: Lease, message: str) -> None:
        """The chunk could not be run: free it for a retry, or, after the last attempt, count
        its lines as failed with a batch error naming them."""
        with self._tx() as tx:
            self._check_lease(tx, lease)
            failures = tx.scalar(
                "SELECT failures FROM chunks WHERE batch_id = ? AND chunk_no = ?",
                (lease.batch_id, lease.chunk_no),
            )
            failures += 1
            tx.q(
                "UPDATE chunks SET failures = ? WHERE batch_id = ? AND chunk_no = ?",
                (failures, lease.batch_id, lease.chunk_no),
            )
            if failures < self.max_chunk_attempts:
                self._end_chunk(tx, lease, PENDING)
                return
            self._end_chunk(tx, lease, FAILED)
            first, end = lease.span.first_line, lease.span.end_line
            note = BatchError(
                "chunk_failed",
                f"lines {first}..{end - 1} failed {failures} times: {message}",
                line=first,
            )
            self._add_failed(tx, lease.batch_id, end - first, note)
        self.finalize(lease.batch_id)

    def release_chunk(self, lease: Lease) -> None:
        """Give a chunk back unrun (a cancel, a drain), without counting a failure."""
        with self._tx() as tx:
            self._check_lease(tx, lease)
            self._end_chunk(tx, lease, PENDING)
        self.finalize(lease.batch_id)

    def finalize(self, batch_id: str) -> Batch:
        """End a batch whose work is over: all chunks done or failed (completed), cancelling
        with no live lease (cancelled), or past its window (expired). The output and error
        files hold the committed lines in line order. Safe to call anytime, from any process;
        a batch that is not ready is returned unchanged."""
        for _ in range(FINALIZE_TRIES):
            target = self._finalize_target(batch_id)
            if target is None:
                break
            assembled = self._assemble(batch_id)
            outcome = self._seal(batch_id, target, assembled)
            if outcome != "raced":
                if outcome == "sealed":
                    self.blobs.delete_tree(f"parts/{batch_id}")
                else:
                    self._discard(assembled)
                break
            self._discard(assembled)
        else:
            raise JobStoreError(f"batch {batch_id!r} kept changing while it was finalized")
        return self.get_batch(batch_id)

    def expire(self) -> list[str]:
        """Finalize every unfinished batch whose completion window has passed."""
        with self._tx(write=False) as tx:
            rows = tx.q(
                "SELECT id FROM batches WHERE status IN (?, ?, ?, ?) AND expires_at <= ?",
                (*LIVE, BatchStatus.CANCELLING, self.clock()),
            ).fetchall()
        ids = [r[0] for r in rows]
        return [i for i in ids if self.finalize(i).status == BatchStatus.EXPIRED]

    def release_owner(self, owner: str) -> int:
        """Free every lease ``owner`` holds, at once; returns how many chunks it held.

        For a process that restarts under a stable owner id (host and process slot): what
        its killed predecessor held is resumed now, not when the leases run out. A live
        holder of one of those leases loses it (its next renew or commit raises LeaseLost),
        so two processes must never share an owner id.
        """
        with self._tx() as tx:
            freed = tx.q(
                "UPDATE chunks SET owner = NULL, lease_expires_at = NULL"
                " WHERE owner = ? AND state = ?",
                (owner, PENDING),
            ).rowcount
            tx.q(
                "UPDATE batches SET owner = NULL, lease_expires_at = NULL"
                " WHERE owner = ? AND status = ?",
                (owner, BatchStatus.VALIDATING),
            )
        return freed

    def _check_lease(self, tx: Tx, lease: Lease) -> None:
        row = tx.one(
            "SELECT c.owner, c.attempt, c.state, b.status FROM chunks c"
            " JOIN batches b ON b.id = c.batch_id WHERE c.batch_id = ? AND c.chunk_no = ?"
            + self.lock_of("c"),
            (lease.batch_id, lease.chunk_no),
        )
        if (
            row is None
            or row["owner"] != lease.owner
            or row["attempt"] != lease.attempt
            or row["state"] != PENDING
            or BatchStatus(row["status"]).terminal
        ):
            raise LeaseLost(f"chunk {lease.chunk_no} of {lease.batch_id} is no longer leased")

    def _end_chunk(self, tx: Tx, lease: Lease, state: str) -> None:
        tx.q(
            "UPDATE chunks SET state = ?, owner = NULL, lease_expires_at = NULL"
            " WHERE batch_id = ? AND chunk_no = ?",
            (state, lease.batch_id, lease.chunk_no),
        )

    def _add_failed(self, tx: Tx, batch_id: str, lines: int, note: BatchError) -> None:
        batch = self._batch(tx, batch_id, lock=True)
        tx.q(
            "UPDATE batches SET failed = failed + ?, errors = ? WHERE id = ?",
            (lines, errors_json([*batch.errors, note]), batch_id),
        )

    def _write_part(self, part: str, batch_id: str, rows: list[LineResult]) -> list[tuple]:
        placed = []
        offset = 0
        with self.blobs.writer(part) as out:
            for r in rows:
                body = r.output if r.ok else r.error
                if body is None:
                    raise ValueError(f"line {r.line_no} has neither an output nor an error")
                out.write(body + b"\n")
                placed.append(
                    (batch_id, r.line_no, r.custom_id, int(r.ok), part, offset, len(body) + 1)
                )
                offset += len(body) + 1
        return placed

    def _live_leases(self, tx: Tx, batch_id: str) -> int:
        return tx.scalar(
            "SELECT COUNT(*) FROM chunks WHERE batch_id = ? AND state = ? AND owner IS NOT NULL"
            " AND lease_expires_at > ?",
            (batch_id, PENDING, self.clock()),
        )

    def _finalize_target(self, batch_id: str) -> BatchStatus | None:
        with self._tx() as tx:
            batch = self._batch(tx, batch_id, lock=True)
            status = batch.status
            if status.terminal:
                return None
            if status == BatchStatus.CANCELLING:
                return None if self._live_leases(tx, batch_id) else BatchStatus.CANCELLED
            if self.clock() >= batch.expires_at:
                return BatchStatus.EXPIRED
            if status == BatchStatus.VALIDATING:
                return None
            pending = tx.scalar(
                "SELECT COUNT(*) FROM chunks WHERE batch_id = ? AND state = ?", (batch_id, PENDING)
            )
            if pending:
                return None
            if status == BatchStatus.IN_PROGRESS:
                self._set_status(tx, batch_id, BatchStatus.FINALIZING)
            return BatchStatus.COMPLETED

    def _assemble(self, batch_id: str) -> _Assembled:
        """Write the output and error files from the committed rows, in line order."""
        out_id, err_id = new_file_id(), new_file_id()
        parts: dict[str, BinaryIO] = {}
        rows = 0
        try:
            with (
                self.blobs.writer(f"files/{out_id}") as out,
                self.blobs.writer(f"files/{err_id}") as err,
            ):
                for row in self._result_rows(batch_id):
                    src = parts.get(row["part"])
                    if src is None:
                        src = parts[row["part"]] = self.blobs.open(row["part"])
                    src.seek(row["part_offset"])
                    (out if row["ok"] else err).write(src.read(row["part_length"]))
                    rows += 1
                sizes = out.tell(), err.tell()
        finally:
            for src in parts.values():
                src.close()
        output = (out_id, sizes[0]) if sizes[0] else None
        error = (err_id, sizes[1]) if sizes[1] else None
        for kept, name in ((output, out_id), (error, err_id)):
            if kept is None:
                self.blobs.delete(f"files/{name}")
        return _Assembled(rows, output, error)

    def _result_rows(self, batch_id: str) -> Iterator[Row]:
        last = -1
        while True:
            with self._tx(write=False) as tx:
                rows = tx.q(
                    "SELECT line_no, ok, part, part_offset, part_length FROM results"
                    " WHERE batch_id = ? AND line_no > ? ORDER BY line_no LIMIT ?",
                    (batch_id, last, ROWS_PER_READ),
                ).fetchall()
            if not rows:
                return
            yield from rows
            last = rows[-1]["line_no"]

    def _seal(self, batch_id: str, target: BatchStatus, done: _Assembled) -> str:
        """Record the assembled files and the final state, unless the batch moved meanwhile."""
        with self._tx() as tx:
            # Chunks before the batch, the order complete_chunk takes them in: no deadlock.
            tx.q(
                "SELECT chunk_no FROM chunks WHERE batch_id = ?" + self.lock_of("chunks"),
                (batch_id,),
            )
            if self._batch(tx, batch_id, lock=True).status.terminal:
                return "lost"
            count = tx.scalar("SELECT COUNT(*) FROM results WHERE batch_id = ?", (batch_id,))
            if count != done.rows:
                return "raced"
            for kind, made in (("output", done.output), ("error", done.error)):
                if made is not None:
                    name = f"{batch_id}_{kind}.jsonl"
                    self._insert_file(made[0], made[1], name, FilePurpose.BATCH_OUTPUT, tx)
            tx.q(
                "UPDATE batches SET output_file_id = ?, error_file_id = ? WHERE id = ?",
                (done.output and done.output[0], done.error and done.error[0], batch_id),
            )
            self._set_status(tx, batch_id, target)
            tx.q("DELETE FROM results WHERE batch_id = ?", (batch_id,))
            tx.q("DELETE FROM chunks WHERE batch_id = ?", (batch_id,))
        return "sealed"

    def _discard(self, done: _Assembled) -> None:
        for made in (done.output, done.error):
            if made is not None:
                self.blobs.delete(f"files/{made[0]}")

"""``--batch``'s results put back in input order with bounded memory.

A batch's output lines come in any order (OpenAI promises none), so each vector is written at
its row's place in a scratch file on disk, ``row * dims * 4`` bytes in (``os.pwrite``: the
page cache holds it, not this process), and a one-byte mark per row in a second file says it
arrived. The output is then written in one sequential pass over both, the ids read again from
the input; a row without a vector is a failed row, listed with the server's reason in
``OUT.errors.jsonl``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pybase64

from mesh.embed_cli.batch_requests import rows_of
from mesh.embed_cli.errors import ServerRefused
from mesh.embed_cli.sinks import NpySink, Sink

EMIT_ROWS = 4096  # rows read back from the scratch file at a time


class Scratch:
    """Vectors by row number on disk: ``vectors.f32`` and the arrival marks ``present.u8``."""

    def __init__(self, directory: Path, rows: int, dims: int) -> None:
        self.rows, self.dims = rows, dims
        self._vectors = os.open(directory / "vectors.f32", os.O_RDWR | os.O_CREAT, 0o600)
        self._present = os.open(directory / "present.u8", os.O_RDWR | os.O_CREAT, 0o600)

    def put(self, row: int, vector: np.ndarray) -> bool:
        """Writes ``row``'s vector; False (and nothing written) when it was there already."""
        if os.pread(self._present, 1, row) == b"\x01":
            return False
        os.pwrite(self._vectors, np.ascontiguousarray(vector, "<f4").tobytes(), row * self.dims * 4)
        os.pwrite(self._present, b"\x01", row)
        return True

    def forget(self, start: int, end: int) -> None:
        """Unmarks rows ``start`` .. ``end``: a batch collected again (after a crash mid-way)
        rewrites them, rather than trusting marks whose vectors may not have reached the disk."""
        os.pwrite(self._present, bytes(end - start), start)

    def sync(self) -> None:
        os.fsync(self._vectors)
        os.fsync(self._present)

    def read(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``start`` .. ``start + count``: (vectors, arrived); absent rows read as 0."""
        width = self.dims * 4
        raw = os.pread(self._vectors, count * width, start * width).ljust(count * width, b"\0")
        marks = os.pread(self._present, count, start).ljust(count, b"\0")
        vectors = np.frombuffer(raw, dtype="<f4").reshape(count, self.dims).copy()
        return vectors, np.frombuffer(marks, dtype=np.uint8) == 1

    def close(self) -> None:
        os.close(self._vectors)
        os.close(self._present)


def decode_vector(embedding: Any) -> np.ndarray:
    if isinstance(embedding, str):
        return np.frombuffer(pybase64.b64decode(embedding, validate=True), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


def result_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each line of a downloaded output or error file."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise ServerRefused(f"{path.name}: line {number} is not JSON") from None
            if not isinstance(doc, dict):
                raise ServerRefused(f"{path.name}: line {number} is not a JSON object")
            yield number, doc


def failure_of(doc: dict[str, Any]) -> str | None:
    """Why a result line failed, or None for a success (OpenAI's line shape)."""
    error, response = doc.get("error"), doc.get("response")
    if error:
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    if not isinstance(response, dict):
        return "no response"
    status = response.get("status_code")
    if status != 200:
        body = response.get("body")
        inner = body.get("error") if isinstance(body, dict) else None
        message = inner.get("message") if isinstance(inner, dict) else inner
        return f"HTTP {status}: {message or body}"
    return None


class Ingest:
    """Reads one batch's result files into the scratch file; failures to ``failures``."""

    def __init__(self, scratch_of: Any, span: tuple[int, int], failures: BinaryIO) -> None:
        self.scratch_of = scratch_of  # dims -> Scratch (the first vector tells the width)
        self.start, self.end = span
        self.failures = failures
        self.tokens = self.duplicates = 0

    def _rows(self, doc: dict[str, Any], where: str) -> range:
        custom = doc.get("custom_id")
        try:
            rows = rows_of(custom)
        except ValueError:
            raise ServerRefused(f"{where}: custom_id {custom!r} is none of ours") from None
        if not self.start <= rows.start < rows.stop <= self.end:
            raise ServerRefused(f"{where}: custom_id {custom!r} is not in this batch")
        return rows

    def file(self, path: Path) -> None:
        for number, doc in result_lines(path):
            where = f"{path.name}: line {number}"
            rows, reason = self._rows(doc, where), failure_of(doc)
            if reason is not None:
                self.failures.writelines(orjson.dumps({"row": row, "error": reason}) + b"\n"
                                         for row in rows)  # fmt: skip
                continue
            body = doc["response"].get("body") or {}
            data = body.get("data") if isinstance(body, dict) else None
            if not isinstance(data, list) or len(data) != len(rows):
                raise ServerRefused(f"{where}: not {len(rows)} embeddings in the response body")
            fresh = False
            for position, item in enumerate(data):
                index = item.get("index", position)
                if not isinstance(index, int) or not 0 <= index < len(rows):
                    raise ServerRefused(f"{where}: an embedding's index {index!r} is out of range")
                fresh |= self._put(rows[index], decode_vector(item.get("embedding")), where)
            if fresh:  # a line answered twice counts its tokens once
                usage = body.get("usage") or {}
                self.tokens += int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)

    def _put(self, row: int, vector: np.ndarray, where: str) -> bool:
        """Writes one vector; False when its row had one already (a duplicate, dropped)."""
        scratch = self.scratch_of(len(vector))
        if len(vector) != scratch.dims:
            raise ServerRefused(f"{where}: a vector of {len(vector)}, not {scratch.dims}")
        if scratch.put(row, vector):
            return True
        self.duplicates += 1
        return False


def failures_by_row(path: Path) -> dict[int, str]:
    """One batch's failed rows and reasons (a batch has at most ``--batch-rows`` rows,
    so this stays bounded whatever the input's size)."""
    found: dict[int, str] = {}
    if path.exists():
        with path.open("rb") as f:
            for line in f:
                doc = orjson.loads(line)
                found.setdefault(int(doc["row"]), str(doc["error"])[:500])
    return found


def emit_span(
    scratch: Scratch | None,
    dims: int,
    span: tuple[int, int],
    failures: dict[int, str],
    ids: Iterator[Any],
    sink: Sink,
    errors: BinaryIO,
) -> int:
    """Writes rows ``span`` to ``sink`` in order, ids taken from ``ids``: the number of rows
    that have no vector, each listed in ``errors`` (``dims``: their width when no row of any
    batch has one, so ``scratch`` is None). A ``.npy`` output keeps their rows, as NaN,
    so row *i* stays input row *i*; the other formats carry ids and leave them out."""
    keep_failed = isinstance(sink, NpySink)
    failed = 0
    for start in range(span[0], span[1], EMIT_ROWS):
        count = min(EMIT_ROWS, span[1] - start)
        chunk_ids = [next(ids) for _ in range(count)]
        if scratch is None:
            vectors, arrived = np.full((count, dims), np.nan, np.float32), np.zeros(count, bool)
        else:
            vectors, arrived = scratch.read(start, count)
        for offset in np.flatnonzero(~arrived).tolist():
            row = start + offset
            reason = failures.get(row, "no result: the batch ended without this row")
            errors.write(
                orjson.dumps({"row": row, "id": chunk_ids[offset], "error": reason}) + b"\n"
            )
            failed += 1
        if keep_failed:
            vectors[~arrived] = np.nan
            sink.write(chunk_ids, vectors)
        elif arrived.any():
            sink.write(
                [i for i, ok in zip(chunk_ids, arrived, strict=True) if ok], vectors[arrived]
            )
    return failed

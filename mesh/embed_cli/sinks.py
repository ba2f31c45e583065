"""Output files written as a stream, in input order, each able to resume a durable prefix.

- ``.npy``: one float32 matrix of shape (rows, dims); the header is written for the final row
  count (counted before the run), rows appended with plain writes (no memory map, so the
  written rows never count towards this process's memory).
- ``.jsonl``: one ``{"id": ..., "embedding": [...]}`` line per row, appended.
- ``.parquet``: columns ``id`` and ``embedding`` (a fixed-size list of float32). A Parquet file
  is only readable once closed, so rows go to numbered part files beside the output
  (``OUT.parquet.parts/``) which ``finish`` joins, row group by row group, into the output.

``sync`` makes what was written durable and returns how many rows that is, with the state
``resume`` needs to continue from exactly there after a crash.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

from mesh.embed_cli.errors import InputError
from mesh.embed_cli.progress import fsync_dir
from mesh.embed_cli.sources import pyarrow_parquet

FORMATS = (".npy", ".jsonl", ".parquet")


class Sink:
    """The output file; ``rows`` counts the rows written so far."""

    def __init__(self, path: Path, total: int) -> None:
        self.path, self.total, self.rows = path, total, 0

    def resume(self, rows: int, state: dict[str, Any]) -> None:
        """Continues after the first ``rows`` rows, as a ``sync`` that returned ``state`` left
        them."""
        raise NotImplementedError

    def write(self, ids: list[Any], vectors: np.ndarray) -> None:
        raise NotImplementedError

    def sync(self, seal: bool = False) -> tuple[int, dict[str, Any]]:
        """(rows durable, the state to resume from them); ``seal``: the run stops here."""
        raise NotImplementedError

    def finish(self, dims: int | None) -> None:
        """Completes the output once every row was written."""
        raise NotImplementedError

    def discard(self) -> None:
        """Removes what a previous run left (``--force``)."""
        self.path.unlink(missing_ok=True)


class NpySink(Sink):
    def __init__(self, path: Path, total: int) -> None:
        super().__init__(path, total)
        self._file: BinaryIO | None = None
        self._dims = 0

    def _create(self, dims: int) -> None:
        self._dims, self._file = dims, self.path.open("wb")
        header = {"descr": "<f4", "fortran_order": False, "shape": (self.total, dims)}
        np.lib.format.write_array_header_2_0(self._file, header)  # type: ignore[no-untyped-call]

    def resume(self, rows: int, state: dict[str, Any]) -> None:
        if rows == 0:
            return
        f = self.path.open("r+b")
        fmt = np.lib.format
        try:
            magic = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if magic == (1, 0) else fmt.read_array_header_2_0
            shape, _, _ = read(f)
            if tuple(shape) != (self.total, state["dims"]):
                raise InputError(f"{self.path}: shape {shape} is not this run's; use --force")
        except BaseException:
            f.close()  # a header that is not this run's, or not an .npy header at all
            raise
        self._file, self._dims, self.rows = f, int(state["dims"]), rows
        f.seek(f.tell() + rows * self._dims * 4)
        f.truncate()  # rows written after the last sync are written again

    def write(self, ids: list[Any], vectors: np.ndarray) -> None:
        if self._file is None:
            self._create(vectors.shape[1])
        assert self._file is not None
        self._file.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
        self.rows += len(vectors)

    def sync(self, seal: bool = False) -> tuple[int, dict[str, Any]]:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            if seal:
                self._file.close()
        return self.rows, {"dims": self._dims}

    def finish(self, dims: int | None) -> None:
        if self.rows != self.total:  # the header states ``total`` rows
            raise InputError(f"the input changed while it was read ({self.total} rows counted, "
                             f"{self.rows} read); use --force")  # fmt: skip
        if self._file is None:  # no rows at all
            self._create(dims or 0)
        self.sync(seal=True)


class JsonlSink(Sink):
    def __init__(self, path: Path, total: int) -> None:
        super().__init__(path, total)
        self._file: BinaryIO | None = None

    def resume(self, rows: int, state: dict[str, Any]) -> None:
        self._file = self.path.open("r+b" if self.path.exists() else "wb")
        self._file.truncate(int(state.get("bytes", 0)))
        self._file.seek(0, os.SEEK_END)
        self.rows = rows

    def write(self, ids: list[Any], vectors: np.ndarray) -> None:
        if self._file is None:
            self._file = self.path.open("wb")
        lines = [
            orjson.dumps({"id": i, "embedding": v}, option=orjson.OPT_SERIALIZE_NUMPY)
            for i, v in zip(ids, vectors, strict=True)
        ]
        self._file.write(b"\n".join(lines) + b"\n")
        self.rows += len(ids)

    def sync(self, seal: bool = False) -> tuple[int, dict[str, Any]]:
        if self._file is None:
            return self.rows, {"bytes": 0}
        self._file.flush()
        os.fsync(self._file.fileno())
        state = {"bytes": self._file.tell()}
        if seal:
            self._file.close()
        return self.rows, state

    def finish(self, dims: int | None) -> None:
        if self._file is None:
            self.path.write_bytes(b"")
            return
        self.sync(seal=True)


def open_sink(path: Path, total: int) -> Sink:
    """The sink for ``path``, by its suffix."""
    from mesh.embed_cli.parquet_sink import ParquetSink

    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"{path}: unknown output format (use {', '.join(FORMATS)})")
    if not path.parent.is_dir():
        raise InputError(f"{path.parent}: no such directory")
    if suffix == ".parquet":
        pyarrow_parquet("writing Parquet")
        return ParquetSink(path, total)
    return NpySink(path, total) if suffix == ".npy" else JsonlSink(path, total)


def remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
        fsync_dir(path.parent)

"""The Parquet output: part files while running, joined into the output at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mesh.embed_cli.errors import InputError
from mesh.embed_cli.progress import fsync_dir
from mesh.embed_cli.sinks import Sink, remove_tree


class ParquetSink(Sink):
    """Rows buffered up to ``GROUP_ROWS`` (one row group), ``PART_GROUPS`` groups a part file.

    A part is durable once closed; ``sync`` reports the rows of closed parts only (and, with
    ``seal``, closes the open one first), so a crash loses at most the open part's rows."""

    GROUP_ROWS = 4096
    PART_GROUPS = 16

    def __init__(self, path: Path, total: int) -> None:
        super().__init__(path, total)
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa, self._pq = pa, pq
        self.parts_dir = path.with_name(path.name + ".parts")
        self._parts = 0  # closed part files
        self._durable = 0  # rows in closed parts
        self._writer: Any = None
        self._groups = 0  # row groups in the open part
        self._ids: list[Any] = []
        self._vectors: list[np.ndarray] = []

    def _part(self, index: int) -> Path:
        return self.parts_dir / f"part-{index:06d}.parquet"

    def resume(self, rows: int, state: dict[str, Any]) -> None:
        self._parts, self._durable, self.rows = int(state.get("parts", 0)), rows, rows
        if self.parts_dir.is_dir():
            for stray in self.parts_dir.glob("part-*.parquet"):
                if int(stray.stem.split("-")[1]) >= self._parts:
                    stray.unlink()  # a part that was still open when the run died

    def write(self, ids: list[Any], vectors: np.ndarray) -> None:
        self._ids.extend(ids)
        self._vectors.append(vectors)
        self.rows += len(ids)
        if len(self._ids) >= self.GROUP_ROWS:
            self._flush_group()

    def _flush_group(self) -> None:
        if not self._ids:
            return
        pa = self._pa
        vectors = np.concatenate(self._vectors).astype(np.float32, copy=False)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])
        try:
            table = pa.table({"id": pa.array(self._ids), "embedding": embedding})
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(f"ids of one type are needed for Parquet output: {exc}") from None
        if self._writer is None:
            self.parts_dir.mkdir(exist_ok=True)
            self._writer = self._pq.ParquetWriter(self._part(self._parts), table.schema)
        self._writer.write_table(table)
        self._ids, self._vectors = [], []
        self._groups += 1
        if self._groups >= self.PART_GROUPS:
            self._close_part()

    def _close_part(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer, self._groups = None, 0
        self._parts += 1
        self._durable = self.rows - len(self._ids)
        fsync_dir(self.parts_dir)

    def sync(self, seal: bool = False) -> tuple[int, dict[str, Any]]:
        if seal:
            self._flush_group()
            self._close_part()
        return self._durable, {"parts": self._parts}

    def finish(self, dims: int | None) -> None:
        self.sync(seal=True)
        pq = self._pq
        writer = None
        try:
            for index in range(self._parts):
                part = pq.ParquetFile(self._part(index))
                for group in range(part.num_row_groups):
                    table = part.read_row_group(group)
                    if writer is None:
                        writer = pq.ParquetWriter(self.path, table.schema)
                    writer.write_table(table.cast(writer.schema))
            if writer is None:  # no rows at all
                writer = pq.ParquetWriter(self.path, self._empty_schema(dims or 0))
        finally:
            if writer is not None:
                writer.close()
        remove_tree(self.parts_dir)

    def _empty_schema(self, dims: int) -> Any:
        pa = self._pa
        return pa.schema([("id", pa.int64()), ("embedding", pa.list_(pa.float32(), dims))])

    def discard(self) -> None:
        super().discard()
        remove_tree(self.parts_dir)

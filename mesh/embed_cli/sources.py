"""Input files read as a stream of ``(id, text)`` rows: JSON Lines, CSV and Parquet.

Each source reads its file lazily (a line, a CSV record, a Parquet record batch at a time), so
memory does not grow with the file. A row's id is its ``id_field`` value where the row has one,
else its 0-based row number.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from mesh.embed_cli.errors import InputError

Row = tuple[Any, str]
PARQUET_HINT = "pip install 'embedmesh[parquet]' (or pyarrow)"
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def pyarrow_parquet(what: str) -> Any:
    """``pyarrow.parquet``, or an input error naming the optional extra that provides it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"{what} needs pyarrow: {PARQUET_HINT}") from None
    return pq


class Source:
    """One input file; ``count()`` and ``rows()`` each read it from the start."""

    def __init__(self, path: Path, text_field: str, id_field: str) -> None:
        self.path, self.text_field, self.id_field = path, text_field, id_field

    def count(self) -> int:
        """The number of rows, in one cheap pass (no JSON decoding)."""
        return sum(1 for _ in self._records())

    def rows(self, skip: int = 0) -> Iterator[Row]:
        """``(id, text)`` for each row after the first ``skip``."""
        for number, record in enumerate(self._records()):
            if number >= skip:
                yield self._row(number, record)

    def _records(self) -> Iterator[Any]:
        raise NotImplementedError

    def _row(self, number: int, record: Any) -> Row:
        raise NotImplementedError

    def _checked(self, number: int, record: dict[str, Any]) -> Row:
        text = record.get(self.text_field)
        if not isinstance(text, str):
            found = "missing" if text is None else f"a {type(text).__name__}"
            raise InputError(
                f"{self.path}: row {number + 1}: field {self.text_field!r} is {found}, not a "
                "string (--text-field names it)"
            )
        return record.get(self.id_field, number), text


class JsonlSource(Source):
    """One JSON object per line (blank lines skipped); a line may also be a bare string."""

    def _records(self) -> Iterator[bytes]:
        with self.path.open("rb") as f:
            for line in f:
                if line.strip():
                    yield line

    def _row(self, number: int, record: bytes) -> Row:
        try:
            doc = orjson.loads(record)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{self.path}: row {number + 1} is not JSON: {exc}") from None
        if isinstance(doc, str):
            return number, doc
        if not isinstance(doc, dict):
            raise InputError(f"{self.path}: row {number + 1} is not a JSON object or string")
        return self._checked(number, doc)


class CsvSource(Source):
    """A CSV file with a header row; quoted fields may span lines."""

    def _records(self) -> Iterator[dict[str, str]]:
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long passages are ordinary here
        with self.path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is not None and self.text_field not in reader.fieldnames:
                raise InputError(
                    f"{self.path}: no column {self.text_field!r} (columns: "
                    f"{', '.join(reader.fieldnames)}; --text-field names it)"
                )
            yield from reader

    def _row(self, number: int, record: dict[str, str]) -> Row:
        return self._checked(number, record)


class ParquetSource(Source):
    """A Parquet file read by record batches, only the text and id columns."""

    BATCH_ROWS = 4096

    def __init__(self, path: Path, text_field: str, id_field: str) -> None:
        super().__init__(path, text_field, id_field)
        self._file = pyarrow_parquet("reading Parquet").ParquetFile(path)
        names = self._file.schema_arrow.names
        if text_field not in names:
            raise InputError(
                f"{path}: no column {text_field!r} (columns: {', '.join(names)}; --text-field "
                "names it)"
            )
        self._columns = [text_field] + ([id_field] if id_field in names else [])

    def count(self) -> int:
        return int(self._file.metadata.num_rows)

    def _records(self) -> Iterator[dict[str, Any]]:
        for batch in self._file.iter_batches(self.BATCH_ROWS, columns=self._columns):
            yield from batch.to_pylist()

    def rows(self, skip: int = 0) -> Iterator[Row]:
        number = 0
        for batch in self._file.iter_batches(self.BATCH_ROWS, columns=self._columns):
            if number + batch.num_rows <= skip:  # a whole batch already done: not decoded
                number += batch.num_rows
                continue
            for record in batch.to_pylist():
                if number >= skip:
                    yield self._checked(number, record)
                number += 1

    def _row(self, number: int, record: dict[str, Any]) -> Row:
        return self._checked(number, record)


def open_source(path: Path, text_field: str, id_field: str) -> Source:
    """The source for ``path``, by its suffix."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InputError(f"{path}: unknown input format (use {', '.join(SUFFIXES)})")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    cls = {"jsonl": JsonlSource, "csv": CsvSource, "parquet": ParquetSource}[kind]
    return cls(path, text_field, id_field)

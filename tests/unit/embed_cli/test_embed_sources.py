"""mesh-embed's inputs: JSON Lines, CSV and Parquet read as (id, text) rows, lazily."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mesh.embed_cli.errors import InputError
from mesh.embed_cli.sources import ParquetSource, open_source

ROWS = [("a", "first text"), ("b", "second, with a comma"), ("c", "third\nspans lines")]


def _jsonl(path: Path) -> Path:
    import json

    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n\n" for i, t in ROWS))
    return path


def _csv(path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text", "other"])
        writer.writerows([(i, t, "x") for i, t in ROWS])
    return path


def _parquet(path: Path) -> Path:
    pq.write_table(pa.table({"id": [i for i, _ in ROWS], "text": [t for _, t in ROWS]}), path)
    return path


@pytest.mark.parametrize("make", [_jsonl, _csv, _parquet], ids=["jsonl", "csv", "parquet"])
def test_every_format_reads_ids_and_texts_in_order_and_counts_them(tmp_path: Path, make) -> None:
    source = open_source(make(tmp_path / f"in.{make.__name__[1:]}"), "text", "id")
    assert source.count() == 3
    assert list(source.rows()) == ROWS
    assert list(source.rows(skip=2)) == ROWS[2:]
    assert list(source.rows(skip=3)) == []


def test_rows_without_the_id_field_are_numbered(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "x"}\n"a bare string"\n{"text": "z", "id": 7}\n')
    assert list(open_source(path, "text", "id").rows()) == [(0, "x"), (1, "a bare string"),
                                                             (7, "z")]  # fmt: skip


def test_parquet_skips_whole_batches_without_decoding_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ParquetSource, "BATCH_ROWS", 2)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(7)]}), path)
    source = open_source(path, "text", "id")
    assert list(source.rows(skip=5)) == [(5, "t5"), (6, "t6")]


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"text": 3}\n', "row 1: field 'text' is a int"),
     ('{"body": "x"}\n', "row 1: field 'text' is missing"),
     ('{"text": "ok"}\n{not json\n', "row 2 is not JSON"),
     ("[1, 2]\n", "row 1 is not a JSON object")],
)  # fmt: skip
def test_a_malformed_jsonl_row_is_an_input_error_naming_it(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        list(open_source(path, "text", "id").rows())


def test_a_csv_without_the_text_column_names_the_columns_it_has(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no column 'body' \(columns: id, text, other"):
        list(open_source(_csv(tmp_path / "in.csv"), "body", "id").rows())


def test_a_parquet_without_the_text_column_is_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no column 'body'"):
        open_source(_parquet(tmp_path / "in.parquet"), "body", "id")


def test_unknown_suffixes_and_missing_files_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown input format"):
        open_source(tmp_path / "in.txt", "text", "id")
    with pytest.raises(InputError, match="no such file"):
        open_source(tmp_path / "in.jsonl", "text", "id")


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    path = _parquet(tmp_path / "in.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(InputError, match=r"needs pyarrow: pip install 'embedmesh\[parquet\]'"):
        open_source(path, "text", "id")

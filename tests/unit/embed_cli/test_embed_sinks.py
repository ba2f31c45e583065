"""mesh-embed's outputs: written in order, and resumed from a synced prefix after a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mesh.embed_cli.errors import InputError
from mesh.embed_cli.parquet_sink import ParquetSink
from mesh.embed_cli.sinks import open_sink

ROWS, DIMS = 10, 4
VECTORS = np.arange(ROWS * DIMS, dtype=np.float32).reshape(ROWS, DIMS) / 7
IDS = [f"id{i}" for i in range(ROWS)]


def read(path: Path) -> tuple[list, np.ndarray]:
    if path.suffix == ".npy":
        return list(range(ROWS)), np.load(path)
    if path.suffix == ".jsonl":
        docs = [json.loads(line) for line in path.read_text().splitlines()]
        return [d["id"] for d in docs], np.array([d["embedding"] for d in docs], np.float32)
    table = pq.read_table(path)
    return table["id"].to_pylist(), np.array(table["embedding"].to_pylist(), np.float32)


@pytest.fixture(autouse=True)
def small_parquet_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ParquetSink, "GROUP_ROWS", 2)
    monkeypatch.setattr(ParquetSink, "PART_GROUPS", 2)


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_rows_written_in_batches_read_back_in_order(tmp_path: Path, suffix: str) -> None:
    sink = open_sink(tmp_path / f"out{suffix}", ROWS)
    for start in range(0, ROWS, 3):
        sink.write(IDS[start : start + 3], VECTORS[start : start + 3])
    sink.finish(DIMS)
    ids, vectors = read(sink.path)
    assert np.array_equal(vectors, VECTORS)
    if suffix != ".npy":
        assert ids == IDS
    assert not sink.path.with_name(sink.path.name + ".parts").exists()


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_a_crash_after_a_sync_resumes_from_the_synced_rows(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"out{suffix}"
    first = open_sink(path, ROWS)
    for row in range(5):
        first.write(IDS[row : row + 1], VECTORS[row : row + 1])
    durable, state = first.sync()
    first.write(IDS[5:8], VECTORS[5:8])  # written, never synced: the process dies here
    del first  # the process dies: nothing more is synced
    if suffix == ".parquet":
        assert durable == 4  # two closed groups of two rows; the fifth is in the open part
    else:
        assert durable == 5
    second = open_sink(path, ROWS)
    second.resume(durable, json.loads(json.dumps(state)))
    second.write(IDS[durable:], VECTORS[durable:])
    second.finish(DIMS)
    ids, vectors = read(path)
    assert np.array_equal(vectors, VECTORS)
    if suffix != ".npy":
        assert ids == IDS


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_a_sealed_sync_makes_every_written_row_durable(tmp_path: Path, suffix: str) -> None:
    sink = open_sink(tmp_path / f"out{suffix}", ROWS)
    sink.write(IDS[:5], VECTORS[:5])
    assert sink.sync(seal=True)[0] == 5


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_an_empty_input_gives_an_empty_output(tmp_path: Path, suffix: str) -> None:
    sink = open_sink(tmp_path / f"out{suffix}", 0)
    sink.finish(DIMS)
    if suffix == ".npy":
        assert np.load(sink.path).shape == (0, DIMS)
    elif suffix == ".jsonl":
        assert sink.path.read_bytes() == b""
    else:
        assert pq.read_table(sink.path).num_rows == 0


def test_the_npy_header_holds_the_final_shape_from_the_start(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "out.npy", ROWS)
    sink.write(IDS[:2], VECTORS[:2])
    sink.sync()
    with (tmp_path / "out.npy").open("rb") as f:
        assert np.lib.format.read_magic(f) == (2, 0)
        assert np.lib.format.read_array_header_2_0(f)[0] == (ROWS, DIMS)


def test_a_resumed_npy_of_another_shape_is_refused(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "out.npy", ROWS)
    sink.write(IDS[:2], VECTORS[:2])
    sink.sync(seal=True)
    with pytest.raises(InputError, match="is not this run's"):
        open_sink(tmp_path / "out.npy", ROWS + 1).resume(2, {"dims": DIMS})


def test_a_resumed_npy_that_is_not_one_is_refused_and_left_closed(tmp_path: Path) -> None:
    """An output damaged where its header was: resuming fails, and the file it opened to read
    the header is closed (this process holds no descriptor on it afterwards)."""
    out = tmp_path / "out.npy"
    out.write_bytes(b"not an npy header" * 8)

    def held() -> int:
        return sum(
            Path(f"/proc/self/fd/{fd}").resolve() == out for fd in os.listdir("/proc/self/fd")
        )

    # The traceback is kept (as a caller reporting the error keeps it): it must not be what
    # holds the file, nor the garbage collector what closes it.
    with pytest.raises(ValueError) as caught:
        open_sink(out, ROWS).resume(2, {"dims": DIMS})
    assert held() == 0, f"the damaged output is still open while its {caught.typename} is kept"


def test_unknown_output_formats_and_missing_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown output format"):
        open_sink(tmp_path / "out.csv", 1)
    with pytest.raises(InputError, match="no such directory"):
        open_sink(tmp_path / "nowhere" / "out.npy", 1)


def test_an_npy_short_of_the_counted_rows_is_not_finished(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "out.npy", ROWS)
    sink.write(IDS[:2], VECTORS[:2])
    with pytest.raises(InputError, match="the input changed while it was read"):
        sink.finish(DIMS)


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_a_run_stopped_after_its_last_row_only_finishes_on_resume(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"out{suffix}"
    first = open_sink(path, ROWS)
    first.write(IDS, VECTORS)
    durable, state = first.sync(seal=True)
    assert durable == ROWS
    second = open_sink(path, ROWS)
    second.resume(durable, state)
    second.finish(DIMS)
    ids, vectors = read(path)
    assert np.array_equal(vectors, VECTORS)
    if suffix != ".npy":
        assert ids == IDS

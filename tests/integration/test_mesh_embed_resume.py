"""mesh-embed as a process: interrupted (SIGINT, SIGTERM) or killed (SIGKILL) mid-run, then
finished with --resume, equals an uninterrupted run with no row doubled or missing; and its
memory stays bounded on a file far larger than its vectors could be held at once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.fake_embeddings import (
    DIMS,
    FakeServer,
    fake_vectors,
    mesh_embed_command,
    peak_rss_mib,
    read_output,
    write_input,
)

ROWS = 2000


@pytest.fixture
def server() -> Iterator[FakeServer]:
    yield from FakeServer().serve()


def saved_rows(marker: Path) -> int:
    try:
        return int(json.loads(marker.read_text())["rows"])
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize(
    ("suffix", "signum", "status"),
    [(".npy", signal.SIGINT, 130), (".jsonl", signal.SIGKILL, -9),
     (".parquet", signal.SIGINT, 130), (".npy", signal.SIGKILL, -9),
     (".jsonl", signal.SIGTERM, 130)],
    ids=["npy-sigint", "jsonl-sigkill", "parquet-sigint", "npy-sigkill", "jsonl-sigterm"],
)  # fmt: skip
def test_a_run_stopped_mid_way_finishes_with_resume_equal_to_an_uninterrupted_one(
    server: FakeServer, tmp_path: Path, suffix: str, signum: int, status: int
) -> None:
    server.delay_s = 0.05  # 100 requests of 20 texts, two at a time: 2.5 s of serving at least
    texts = [f"row {i} of the file" for i in range(ROWS)]
    source, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / f"out{suffix}"
    marker = tmp_path / f"out{suffix}.progress"
    argv = [*mesh_embed_command(), str(source), "-o", str(out), "--url", server.url, "--model",
            "fake", "--batch-size", "20", "--concurrency", "2", "--quiet"]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # Parquet output records only closed part files (none before the end of so small a file).
    while server.served < 300 or (suffix != ".parquet" and saved_rows(marker) < 100):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no progress recorded"
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    if status == 130:
        assert "rerun with --resume" in err
    time.sleep(server.delay_s * 4)  # the requests it left in flight are answered (to no one)
    saved, served = saved_rows(marker), server.served
    assert saved < ROWS
    resumed = subprocess.run([*argv, "--resume"], stderr=subprocess.PIPE, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert server.served - served == ROWS - saved  # only the rows not saved were sent again
    ids, vectors = read_output(out)
    assert np.array_equal(vectors, fake_vectors(texts))
    assert ids in (None, [f"doc-{i}" for i in range(ROWS)])
    assert not marker.exists()


def test_memory_stays_bounded_on_a_file_whose_vectors_would_not_fit(
    server: FakeServer, tmp_path: Path
) -> None:
    big, small = 200_000, 2_000
    as_floats_mib = big * DIMS * 4 / 2**20  # 293 MiB, were every vector held at once
    source = tmp_path / "big.jsonl"
    with source.open("wb") as f:
        f.writelines(orjson.dumps({"text": f"r{i}"}) + b"\n" for i in range(big))
    head = write_input(tmp_path / "small.jsonl", [f"r{i}" for i in range(small)])
    common = ["--url", server.url, "--model", "fake", "--batch-size", "256", "--quiet"]
    baseline = peak_rss_mib([str(head), "-o", str(tmp_path / "small.npy"), *common])
    peak = peak_rss_mib([str(source), "-o", str(tmp_path / "big.npy"), *common])
    assert peak - baseline < 48, (baseline, peak, as_floats_mib)
    vectors = np.load(tmp_path / "big.npy", mmap_mode="r")
    assert vectors.shape == (big, DIMS)
    rows = [0, 123_457, big - 1]
    assert np.array_equal(vectors[rows], fake_vectors([f"r{i}" for i in rows]))

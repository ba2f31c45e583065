"""mesh-embed --batch as a process against a fake Files and Batches API: the output equals the
direct mode's, split over several batches; failed lines are listed and exit 4; Ctrl-C leaves
the batches running and --resume reattaches to them (no batch created twice); with
--cancel-on-interrupt they are cancelled and --resume submits them again; kill -9 too; and its
memory stays bounded on a file whose vectors it could not hold."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.fake_batches import FakeBatchServer, serve_batches
from tests.fake_embeddings import (
    DIMS,
    fake_vectors,
    mesh_embed_command,
    peak_rss_mib,
    read_output,
    write_input,
)

ROWS = 600


@pytest.fixture
def server() -> Iterator[FakeBatchServer]:
    yield from serve_batches()


def command(server: FakeBatchServer, source: Path, out: Path, *extra: str) -> list[str]:
    return [*mesh_embed_command(), str(source), "-o", str(out), "--url", server.url, "--model",
            "fake", "--quiet", "--poll-interval", "0.1", *extra]  # fmt: skip


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".parquet"])
def test_batch_output_equals_the_direct_mode_s_over_several_batches(
    server: FakeBatchServer, tmp_path: Path, suffix: str
) -> None:
    texts = [f"passage {i} about indexing" for i in range(ROWS)]
    source = write_input(tmp_path / "in.jsonl", texts)
    direct, batched = tmp_path / f"direct{suffix}", tmp_path / f"batch{suffix}"
    assert subprocess.run(command(server, source, direct), timeout=120).returncode == 0
    done = subprocess.run(command(server, source, batched, "--batch", "--batch-size", "10",
                                  "--batch-rows", "250"),
                          stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(server.batches) == 3
    direct_ids, direct_vectors = read_output(direct)
    ids, vectors = read_output(batched)
    assert ids == direct_ids
    assert np.array_equal(vectors, direct_vectors)
    assert np.array_equal(vectors, fake_vectors(texts))
    uploads = {b["input_file_id"] for b in server.batches.values()}
    assert uploads <= set(server.deleted)  # the request files were deleted at the end
    assert not (tmp_path / f"batch{suffix}.batch").exists()
    assert not (tmp_path / f"batch{suffix}.progress").exists()


def test_failed_lines_are_listed_with_their_ids_and_exit_4(
    server: FakeBatchServer, tmp_path: Path
) -> None:
    texts = [f"BAD {i}" if i in (3, 250) else f"fine {i}" for i in range(300)]
    source, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / "out.jsonl"
    done = subprocess.run(command(server, source, out, "--batch", "--batch-size", "1",
                                  "--batch-rows", "200"),
                          stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "2 rows failed" in done.stderr
    assert "row 4 (id 'doc-3'): " in done.stderr and "row 251 (id 'doc-250'): " in done.stderr
    errors = [
        orjson.loads(x) for x in (tmp_path / "out.jsonl.errors.jsonl").read_bytes().splitlines()
    ]
    assert [(e["row"], e["id"]) for e in errors] == [(3, "doc-3"), (250, "doc-250")]
    assert "refused" in errors[0]["error"]
    ids, vectors = read_output(out)
    kept = [i for i in range(300) if i not in (3, 250)]
    assert ids == [f"doc-{i}" for i in kept]
    assert np.array_equal(vectors, fake_vectors([texts[i] for i in kept]))


def stop_mid_way(server: FakeBatchServer, argv: list[str], signum: int) -> str:
    """Starts mesh-embed and sends ``signum`` once every batch is submitted and running."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(server.batches) < 2 or server.lines_run < 50:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the batches did not start"
        time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if signum != signal.SIGKILL else -9), err
    return err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_an_interrupted_run_reattaches_to_its_running_batches_with_resume(
    server: FakeBatchServer, tmp_path: Path, signum: int
) -> None:
    server.line_delay_s = 0.004  # 2.4 s of batch work
    texts = [f"row {i}" for i in range(ROWS)]
    source, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / "out.npy"
    argv = command(server, source, out, "--batch", "--batch-size", "1", "--batch-rows",
                   "300")  # fmt: skip
    err = stop_mid_way(server, argv, signum)
    if signum == signal.SIGINT:
        assert "keep running on the server" in err and "--resume" in err
        assert all(b in err for b in server.batches)
    assert server.running()  # not cancelled
    created = set(server.batches)
    resumed = subprocess.run([*argv, "--resume"], stderr=subprocess.PIPE, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert set(server.batches) == created  # reattached: no batch submitted again
    assert np.array_equal(np.load(out), fake_vectors(texts))


def test_cancel_on_interrupt_cancels_and_resume_submits_again(
    server: FakeBatchServer, tmp_path: Path
) -> None:
    server.line_delay_s = 0.004
    texts = [f"row {i}" for i in range(ROWS)]
    source, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / "out.jsonl"
    argv = command(server, source, out, "--batch", "--batch-size", "1", "--batch-rows",
                   "300")  # fmt: skip
    err = stop_mid_way(server, [*argv, "--cancel-on-interrupt"], signal.SIGINT)
    assert "cancelled" in err
    server.wait_idle()
    assert {b["status"] for b in server.batches.values()} <= {"cancelled", "completed"}
    cancelled = sum(b["status"] == "cancelled" for b in server.batches.values())
    assert cancelled >= 1
    before = len(server.batches)
    resumed = subprocess.run([*argv, "--resume"], stderr=subprocess.PIPE, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert len(server.batches) == before + cancelled
    ids, vectors = read_output(out)
    assert ids == [f"doc-{i}" for i in range(ROWS)]
    assert np.array_equal(vectors, fake_vectors(texts))


def test_a_direct_run_s_progress_is_not_resumed_as_a_batch_run(
    server: FakeBatchServer, tmp_path: Path
) -> None:
    source, out = write_input(tmp_path / "in.jsonl", ["a", "b"]), tmp_path / "out.npy"
    (tmp_path / "out.npy.progress").write_text('{"job": {}, "rows": 0, "sink": {}}')
    done = subprocess.run(command(server, source, out, "--batch", "--resume"),
                          stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert "belongs to another run" in done.stderr
    assert not server.batches


def test_memory_stays_bounded_on_a_file_whose_vectors_would_not_fit(
    server: FakeBatchServer, tmp_path: Path
) -> None:
    big, small = 100_000, 2_000
    as_floats_mib = big * DIMS * 4 / 2**20  # 146 MiB, were every vector held at once
    source = tmp_path / "big.jsonl"
    with source.open("wb") as f:
        f.writelines(orjson.dumps({"text": f"r{i}"}) + b"\n" for i in range(big))
    head = write_input(tmp_path / "small.jsonl", [f"r{i}" for i in range(small)])
    common = ["--url", server.url, "--model", "fake", "--batch", "--batch-rows", "40000",
              "--poll-interval", "0.2", "--quiet"]  # fmt: skip
    baseline = peak_rss_mib([str(head), "-o", str(tmp_path / "small.npy"), *common])
    peak = peak_rss_mib([str(source), "-o", str(tmp_path / "big.npy"), *common])
    assert peak - baseline < 48, (baseline, peak, as_floats_mib)
    vectors = np.load(tmp_path / "big.npy", mmap_mode="r")
    assert vectors.shape == (big, DIMS)
    rows = [0, 54_321, big - 1]
    assert np.array_equal(vectors[rows], fake_vectors([f"r{i}" for i in rows]))

"""``mesh-embed`` as a user runs it, against ``mesh-launch --role ingress`` serving the
built-in all-MiniLM-L6-v2: each input and output format holds what ``/v1/embeddings`` answers
for the same texts, and a run interrupted (SIGINT) or killed (SIGKILL) mid-way and finished
with ``--resume`` equals an uninterrupted one."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import API_KEY, AUTH, MODEL, ODD_TEXTS, Ingress
from tests.fake_embeddings import mesh_embed_command, read_output, write_input


@pytest.fixture(scope="module")
def short_texts(corpus: list[dict]) -> list[str]:
    """Texts well within the model's 256 tokens: the odd ones, queries and short passages."""
    short = [r["text"] for r in corpus if len(r["text"]) < 500]
    return ODD_TEXTS + short[:120]


def served(ingress: Ingress, texts: list[str]) -> np.ndarray:
    """What POST /v1/embeddings answers for ``texts`` (floats, in chunks of 64)."""
    rows = []
    for start in range(0, len(texts), 64):
        body = {"model": MODEL, "input": texts[start : start + 64], "encoding_format": "float"}
        request = urllib.request.Request(f"{ingress.url}/v1/embeddings",
                                         data=json.dumps(body).encode(),
                                         headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as resp:
            data = json.loads(resp.read())["data"]
        rows += [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]
    return np.array(rows, dtype=np.float32)


def mesh_embed(ingress: Ingress, source: Path, out: Path, *more: str) -> list[str]:
    return [*mesh_embed_command(), str(source), "-o", str(out), "--url", f"{ingress.url}/v1",
            "--model", MODEL, "--api-key", API_KEY, *more]  # fmt: skip


def assert_same_vectors(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to the float noise of different batch compositions on the CPU."""
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize(("suffix_in", "suffix_out"),
                         [(".jsonl", ".npy"), (".csv", ".jsonl"), (".parquet", ".parquet")])  # fmt: skip
def test_each_format_holds_what_v1_embeddings_answers_for_the_same_texts(
    ingress: Ingress, short_texts: list[str], tmp_path: Path, suffix_in: str, suffix_out: str
) -> None:
    source = write_input(tmp_path / f"in{suffix_in}", short_texts)
    out = tmp_path / f"out{suffix_out}"
    done = subprocess.run(mesh_embed(ingress, source, out, "--batch-size", "32"),
                          stderr=subprocess.PIPE, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"wrote {len(short_texts):,} rows to {out}" in done.stderr
    ids, vectors = read_output(out)
    assert_same_vectors(vectors, served(ingress, short_texts))
    assert ids in (None, [f"doc-{i}" for i in range(len(short_texts))])


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGKILL, -9)],
                         ids=["sigint", "sigkill"])  # fmt: skip
def test_a_run_stopped_mid_way_and_resumed_equals_an_uninterrupted_one(
    ingress: Ingress, short_texts: list[str], tmp_path: Path, signum: int, status: int
) -> None:
    texts = short_texts * 4  # a run of ~130 requests: long enough to stop on a busy host
    source = write_input(tmp_path / "in.jsonl", texts)
    whole, out = tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
    slow = ("--batch-size", "4", "--concurrency", "1", "--quiet")
    assert subprocess.run(mesh_embed(ingress, source, whole, *slow), timeout=240).returncode == 0
    proc = subprocess.Popen(mesh_embed(ingress, source, out, *slow), stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    marker, deadline = tmp_path / "out.jsonl.progress", time.monotonic() + 120
    while not marker.exists() or json.loads(marker.read_text())["rows"] < 12:
        assert proc.poll() is None, f"finished before it could be stopped: {proc.stderr}"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signum)
    assert proc.wait(30) == status
    saved = json.loads(marker.read_text())["rows"]
    assert 12 <= saved < len(texts)
    resumed = subprocess.run(mesh_embed(ingress, source, out, *slow, "--resume"),
                             stderr=subprocess.PIPE, text=True, timeout=240)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    ids, vectors = read_output(out)
    want_ids, want = read_output(whole)
    assert ids == want_ids == [f"doc-{i}" for i in range(len(texts))]
    assert_same_vectors(vectors, want)

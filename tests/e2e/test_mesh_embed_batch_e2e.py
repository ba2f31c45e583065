"""``mesh-embed --batch`` against a real mesh (broker, worker, ``mesh-launch --role ingress``
with a state directory of its own) serving the built-in all-MiniLM-L6-v2: the output equals
the direct mode's for the same file, over several batches; a row the server refuses is listed
with its id and exits 4; Ctrl-C leaves the batches running and ``--resume`` reattaches to them,
submitting none again."""

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

from tests.batch_client import client_of
from tests.e2e.conftest import Ingress
from tests.fake_embeddings import mesh_embed_command, read_output, write_input
from tests.integration.conftest import MODEL, Mesh

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ingress]:
    root = tmp_path_factory.mktemp("embed-batch")
    mesh = Mesh(root)
    mesh.start_broker()
    mesh.start_worker("--threads", "2")
    ing = Ingress(mesh, "--state-dir", str(root / "state"))
    try:
        ing.wait_health()
        yield ing
    finally:
        ing.stop()
        mesh.stop()


@pytest.fixture(scope="module")
def texts(corpus: list[dict]) -> list[str]:
    return [r["text"] for r in corpus if len(r["text"]) < 400][:150]


def mesh_embed(ingress: Ingress, source: Path, out: Path, *more: str) -> list[str]:
    return [*mesh_embed_command(), str(source), "-o", str(out), "--url", f"{ingress.url}/v1",
            "--model", MODEL, "--quiet", *more]  # fmt: skip


def batches_of(ingress: Ingress) -> list[str]:
    return [b.id for b in client_of(ingress.url).batches.list(limit=100)]


def test_batch_output_equals_the_direct_mode_s_for_the_same_file(
    served: Ingress, texts: list[str], tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", texts)
    direct, batched = tmp_path / "direct.jsonl", tmp_path / "batch.jsonl"
    done = subprocess.run(mesh_embed(served, source, direct), stderr=subprocess.PIPE, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    before = len(batches_of(served))
    done = subprocess.run(mesh_embed(served, source, batched, "--batch", "--batch-size", "16",
                                     "--batch-rows", "64", "--poll-interval", "0.5"),
                          stderr=subprocess.PIPE, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(batches_of(served)) - before == 3  # 150 rows, 64 a batch
    direct_ids, direct_vectors = read_output(direct)
    ids, vectors = read_output(batched)
    assert ids == direct_ids == [f"doc-{i}" for i in range(len(texts))]
    # Equal up to the float noise of different batch compositions on the CPU.
    assert np.abs(vectors - direct_vectors).max() < 1e-5


def test_a_row_the_server_refuses_is_listed_with_its_id_and_exits_4(
    served: Ingress, texts: list[str], tmp_path: Path
) -> None:
    rows = [*texts[:20], "", *texts[20:30]]  # an empty input is refused, that line only
    source, out = write_input(tmp_path / "in.jsonl", rows), tmp_path / "out.npy"
    done = subprocess.run(mesh_embed(served, source, out, "--batch", "--batch-size", "1",
                                     "--poll-interval", "0.5"),
                          stderr=subprocess.PIPE, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 4, done.stderr
    errors = [
        orjson.loads(x) for x in (tmp_path / "out.npy.errors.jsonl").read_bytes().splitlines()
    ]
    assert [(e["row"], e["id"]) for e in errors] == [(20, "doc-20")]
    assert errors[0]["error"]
    vectors = np.load(out)
    assert vectors.shape == (31, 384)
    assert np.isnan(vectors[20]).all() and not np.isnan(np.delete(vectors, 20, axis=0)).any()


def submitted(marker: Path) -> list[str]:
    try:
        parts = json.loads(marker.read_text())["sink"].get("parts", [])
    except (OSError, ValueError):
        return []
    return [p["batch_id"] for p in parts if p.get("batch_id")]


def test_an_interrupted_run_reattaches_to_its_batch_with_resume(
    served: Ingress, texts: list[str], tmp_path: Path
) -> None:
    source, out = write_input(tmp_path / "in.jsonl", texts), tmp_path / "out.parquet"
    argv = mesh_embed(served, source, out, "--batch", "--poll-interval", "0.5")
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    marker, deadline = tmp_path / "out.parquet.progress", time.monotonic() + 120
    while not submitted(marker):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no batch was submitted"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    (batch_id,) = submitted(marker)
    assert batch_id in err and "--resume" in err
    before = batches_of(served)
    resumed = subprocess.run([*argv, "--resume"], stderr=subprocess.PIPE, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert batches_of(served) == before  # reattached: nothing submitted again
    ids, vectors = read_output(out)
    assert ids == [f"doc-{i}" for i in range(len(texts))]
    assert vectors.shape == (len(texts), 384) and not np.isnan(vectors).any()

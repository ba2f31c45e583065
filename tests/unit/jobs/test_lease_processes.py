"""Leases across real processes: one killed with SIGKILL mid-chunk, others racing to claim."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from mesh.jobs import BatchStatus
from tests.unit.jobs.conftest import Target, output_lines, run_worker, start_batch

WAIT_S = 90


def _wait_for(path: Path, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def _claims(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_chunk_of_a_worker_killed_mid_way_is_finished_by_another_process(
    target: Target, tmp_path: Path
) -> None:
    store = target.open()
    batch_id = start_batch(store, 40, chunk_lines=5)
    log, marker = tmp_path / "claims.jsonl", tmp_path / "hung"
    doomed = run_worker(
        target, "doomed", "--lease-s", "1.5", "--claims-log", str(log),
        "--hang-on-claim", "3", "--hang-marker", str(marker),
    )  # fmt: skip
    try:
        _wait_for(marker)
    finally:
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()
    assert store.get_batch(batch_id).request_counts.completed == 10
    survivor = run_worker(target, "survivor", "--lease-s", "5", "--claims-log", str(log))
    assert survivor.wait(timeout=WAIT_S) == 0

    batch = store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.request_counts.completed, batch.request_counts.failed) == (40, 0)
    lines = output_lines(store, batch.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{n}" for n in range(40)]
    assert [line["owner"] for line in lines[:10]] == ["doomed"] * 10
    assert {line["owner"] for line in lines[10:]} == {"survivor"}
    claims = [(c["chunk"], c["owner"], c["attempt"]) for c in _claims(log)]
    assert claims[:3] == [(0, "doomed", 1), (1, "doomed", 1), (2, "doomed", 1)]
    assert (2, "survivor", 2) in claims
    assert sorted(c for c, _, _ in claims) == [0, 1, 2, 2, 3, 4, 5, 6, 7]
    store.close()


def test_processes_claiming_at_once_never_share_a_chunk_and_each_line_lands_once(
    target: Target, tmp_path: Path
) -> None:
    store = target.open()
    batch_id = start_batch(store, 240, chunk_lines=4)
    log = tmp_path / "claims.jsonl"
    workers = [
        run_worker(target, f"p{n}", "--line-delay", "0.002", "--claims-log", str(log))
        for n in range(4)
    ]
    assert [w.wait(timeout=WAIT_S) for w in workers] == [0] * 4

    claims = [(c["chunk"], c["attempt"]) for c in _claims(log)]
    assert sorted(claims) == [(n, 1) for n in range(60)]
    assert len({c["owner"] for c in _claims(log)}) > 1
    batch = store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED
    lines = output_lines(store, batch.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{n}" for n in range(240)]
    assert [line["line"] for line in lines] == list(range(240))
    store.close()

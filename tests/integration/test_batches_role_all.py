"""``mesh-launch --role all --ingress-procs 2`` as a user runs it, with a batch: each ingress
child is a batch runner with its own lease owner id (its slot), a child killed with -9 mid-batch
is restarted by the supervisor under the same id and frees its predecessor's leases at once, and
the batch completes with every custom_id exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spawn import free_port
from tests.batch_client import TERMINAL, assert_each_once, client_of, start_running, wait_batch
from tests.integration.launched import START_S, Launched, cmdline, start, wait_gone
from tests.integration.test_ingress_procs import ingress_children

pytestmark = pytest.mark.timeout(400)
CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus.jsonl"


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[tuple[Launched, int]]:
    port = free_port()
    run = start(
        tmp_path, "--ingress-procs", "2", "--threads", "1", "--http-port", str(port),
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    yield run, port
    run.kill()


def slot_of(pid: int) -> str:
    found = re.search(r"--ingress-slot (\d+)", cmdline(pid))
    assert found, cmdline(pid)
    return found.group(1)


def test_a_batch_finishes_through_an_ingress_child_killed_mid_way(
    launched: tuple[Launched, int],
) -> None:
    run, port = launched
    line = run.first_line(START_S)
    assert line.startswith("embedmesh serving"), run.stderr.read_text()[-3000:]
    children = ingress_children(run.proc.pid)
    assert sorted(slot_of(pid) for pid in children) == ["0", "1"]
    corpus = [json.loads(row) for row in CORPUS.read_text().splitlines()]
    client = client_of(f"http://127.0.0.1:{port}", retries=5)
    batch = start_running(client, corpus, 300)
    victim = min(children)
    slot = slot_of(victim)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the supervisor restarts it in the same slot
        restarted = ingress_children(run.proc.pid) - children
        if restarted:
            break
        time.sleep(0.2)
    assert [slot_of(pid) for pid in restarted] == [slot]
    assert_each_once(client, wait_batch(client, batch.id, TERMINAL, 300), 300)
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=60) == 0, run.stderr.read_text()[-4000:]
    assert not wait_gone(restarted | children)

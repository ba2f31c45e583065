"""Every job store test runs twice: on SQLite, and on a throwaway PostgreSQL server."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mesh.jobs import JobStore, LineResult, open_store
from mesh.jobs.store import Lease
from tests.pg_server import PostgresServer, find_bin_dir

WORKER_SCRIPT = Path(__file__).with_name("chunk_worker.py")
REPO = Path(__file__).resolve().parents[3]


class FakeClock:
    """A clock the test moves: leases and completion windows expire when it says."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Target:
    """Where a store lives; ``open`` gives one more handle on it (one per simulated process)."""

    kind: str
    state_dir: Path
    state_url: str | None

    def open(self, **options: Any) -> JobStore:
        return open_store(self.state_dir, self.state_url, **options)

    def argv(self) -> list[str]:
        """The arguments that point ``chunk_worker.py`` at this store."""
        return ["--state-dir", str(self.state_dir), "--state-url", self.state_url or ""]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
    server = PostgresServer(bin_dir)
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        with contextlib.suppress(Exception):
            server.stop()
        pytest.skip(f"could not start a PostgreSQL server: {exc}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return Target("sqlite", tmp_path / "state", None)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return Target("postgres", tmp_path / "state", server.create_database())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(target: Target, clock: FakeClock) -> Iterator[JobStore]:
    opened = target.open(clock=clock)
    yield opened
    opened.close()


def jsonl(count: int, *, start: int = 0) -> bytes:
    """A batch input file of ``count`` embedding requests, custom ids ``req-<n>``."""
    return b"".join(
        json.dumps(
            {
                "custom_id": f"req-{n}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "m", "input": f"text {n}"},
            }
        ).encode()
        + b"\n"
        for n in range(start, start + count)
    )


def results_for(store: JobStore, lease: Lease, *, fail: set[int] = frozenset()) -> list[LineResult]:
    """What a runner would produce for a chunk: an output line per request, errors for ``fail``."""
    lines = store.read_chunk(lease)
    out = []
    for line_no, raw in enumerate(lines, start=lease.span.first_line):
        custom_id = json.loads(raw)["custom_id"]
        body = {"id": f"r-{line_no}", "custom_id": custom_id, "owner": lease.owner}
        if line_no in fail:
            out.append(LineResult(line_no, custom_id, error=json.dumps(body).encode()))
        else:
            out.append(LineResult(line_no, custom_id, output=json.dumps(body).encode(), tokens=2))
    return out


def start_batch(store: JobStore, lines: int, *, chunk_lines: int, window: str = "24h") -> str:
    """Upload ``lines`` requests and run them as a batch of ``chunk_lines``-line chunks."""
    upload = store.create_file(jsonl(lines), filename="in.jsonl", purpose="batch")
    batch = store.create_batch(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window=window
    )
    chunks = store.plan_chunks(upload.id, chunk_lines)
    store.start_batch(batch.id, chunks, tokens_total=2 * lines)
    return batch.id


def output_lines(store: JobStore, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    with store.open_file(file_id) as src:
        return [json.loads(line) for line in src.read().splitlines()]


def run_worker(target: Target, owner: str, *extra: str) -> subprocess.Popen[bytes]:
    """Start ``chunk_worker.py`` as a real process on ``target``'s store."""
    return subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), *target.argv(), "--owner", owner, *extra],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )

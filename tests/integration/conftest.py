"""Real meshes for integration tests: each role a real process started by mesh-launch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.spawn import stop_processes
from mesh.client import MeshClient
from mesh.config import Liveness
from tests.hosts import HostMesh

MODEL = "all-MiniLM-L6-v2"
INTERVAL_S = 0.25  # heartbeats in tests: fast enough to see deaths in a second or so
LIVENESS = 4
TEST_LIVENESS = Liveness(INTERVAL_S, LIVENESS)


class Mesh:
    """A broker and workers as subprocesses on ipc:// endpoints in a temp dir."""

    def __init__(
        self, tmp: Path, transport: str = "ipc", liveness: Liveness = TEST_LIVENESS
    ) -> None:
        self.tmp = tmp
        self.liveness = liveness
        if transport == "ipc":
            self.frontend = f"ipc://{tmp}/front"
            self.backend = f"ipc://{tmp}/back"
        else:
            import socket

            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports.append(s.getsockname()[1])
            self.frontend = f"tcp://127.0.0.1:{ports[0]}"
            self.backend = f"tcp://127.0.0.1:{ports[1]}"
        self.broker: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []

    def _spawn(
        self, name: str, args: list[str], env_extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}-{len(self._logs)}.log"
        self._logs.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env_extra or {})}
        cmd = [
            sys.executable,
            "-m",
            "launch.cli",
            *args,
            "--heartbeat-interval",
            str(self.liveness.interval_s),
            "--heartbeat-liveness",
            str(self.liveness.liveness),
        ]
        with open(log, "wb") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def start_broker(self, *extra: str) -> subprocess.Popen[bytes]:
        self.broker = self._spawn(
            "broker",
            ["--role", "broker", "--frontend", self.frontend, "--backend", self.backend, *extra],
        )
        return self.broker

    def start_worker(
        self, *extra: str, broker: str | None = None, hang_after: int | None = None
    ) -> subprocess.Popen[bytes]:
        """A worker of ``broker`` (default: this mesh's backend; a proxy in front of it, say);
        with ``hang_after``, one whose compute loop hangs after that many batches (the test
        hook EMBEDMESH_TEST_HANG_AFTER)."""
        hook = {} if hang_after is None else {"EMBEDMESH_TEST_HANG_AFTER": str(hang_after)}
        proc = self._spawn(
            "worker",
            [
                "--role",
                "worker",
                "--broker",
                broker or self.backend,
                "--threads",
                "1",
                "--max-batch-tokens",
                "2048",
                *extra,
            ],
            hook,
        )
        self.workers.append(proc)
        return proc

    def logs(self, tail: int | None = 3000) -> str:
        """Every process's log, each cut to its last ``tail`` characters (None: whole)."""

        def cut(text: str) -> str:
            return text if tail is None else text[max(0, len(text) - tail) :]

        return "\n".join(f"--- {p.name}\n{cut(p.read_text(errors='replace'))}" for p in self._logs)

    def stop(self) -> None:
        stop_processes([p for p in [self.broker, *self.workers] if p is not None])


async def wait_for_workers(client: MeshClient, n: int, timeout_s: float = 60) -> None:
    """Until the catalog shows ``n`` workers for MODEL."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = {m.name: m for m in client.models()}
        if MODEL in models and models[MODEL].workers >= n:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{n} workers did not register within {timeout_s}s")


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path)
    yield m
    m.stop()


@pytest.fixture
def host_mesh(tmp_path: Path) -> Iterator[Callable[..., HostMesh]]:
    """``host_mesh(n, curve=True)``: n network-namespace hosts to start roles on; everything
    torn down at the end, the test passed or not. Skips where namespaces are not allowed."""
    from bench.netns import Hosts, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    made: list[Hosts] = []

    def make(n: int, curve: bool = True) -> HostMesh:
        hosts = Hosts(n)
        made.append(hosts)
        hosts.__enter__()
        return HostMesh(hosts, tmp_path, curve=curve)

    yield make
    for hosts in made:
        hosts.close()


@pytest.fixture
def tcp_mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, transport="tcp")
    yield m
    m.stop()

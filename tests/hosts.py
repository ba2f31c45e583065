"""Mesh roles on network-namespace hosts (bench/netns.py): each role a real ``mesh-launch``
process on a host of its own address, every link TCP between hosts, CURVE on every link (or
``--insecure``). The ``host_mesh`` fixture (tests/integration/conftest.py) builds one and tears
it down, processes and namespaces, however the test ends; it skips where namespaces are not
allowed (not root, no ``ip netns``).

The test process stays in the root namespace; what must reach a host's address (HTTP load, a
catalog poll) runs in a thread that entered a host (``Host.run_here``, ``Load(netns=...)``).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.netns import Host, Hosts
from mesh.config import Liveness
from tests.integration.launched import MODEL, launch_command

FRONT, BACK, HTTP = 5555, 5556, 8000
# Fast heartbeats (a 2 s window), as a fleet that wants a lost host seen quickly would set.
HOST_LIVENESS = Liveness(0.5, 4)


@dataclass
class HostMesh:
    """Starts roles on ``hosts``; their logs under ``tmp``."""

    hosts: Hosts
    tmp: Path
    curve: bool = True
    liveness: Liveness = field(default_factory=lambda: HOST_LIVENESS)
    _logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.curve:
            subprocess.run(
                [*launch_command(), "--gen-keys", str(self.tmp / "keys")],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip

    def _security(self) -> list[str]:
        return ["--curve-dir", str(self.tmp / "keys")] if self.curve else ["--insecure"]

    def _start(self, host: Host, role: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{role}-{host.name}-{len(self._logs)}.log"
        self._logs.append(log)
        argv = [
            *launch_command(), "--role", role, *args, *self._security(),
            "--heartbeat-interval", str(self.liveness.interval_s),
            "--heartbeat-liveness", str(self.liveness.liveness),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        with log.open("wb") as out:
            return host.popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def broker(self, host: Host, *extra: str) -> subprocess.Popen[bytes]:
        front, back = f"tcp://{host.ip}:{FRONT}", f"tcp://{host.ip}:{BACK}"
        return self._start(host, "broker", ["--frontend", front, "--backend", back, *extra])

    def worker(
        self, host: Host, broker: Host, *extra: str, via: str | None = None
    ) -> subprocess.Popen[bytes]:
        """A worker of ``broker``'s backend, or of the endpoint ``via`` (a proxy before it)."""
        args = ["--broker", via or f"tcp://{broker.ip}:{BACK}", "--threads", "1"]
        return self._start(host, "worker", [*args, "--max-batch-tokens", "2048", *extra])

    def ingress(self, host: Host, brokers: list[Host], *extra: str) -> str:
        """An ingress on ``host`` linked to ``brokers``; the base URL of its /v1."""
        links = [arg for b in brokers for arg in ("--broker", f"tcp://{b.ip}:{FRONT}")]
        args = ["--http-host", host.ip, "--http-port", str(HTTP), "--ingress-procs", "1"]
        self._start(host, "ingress", [*links, *args, *extra])
        return f"http://{host.ip}:{HTTP}/v1"

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in self._logs
        )


def models(host: Host, base: str) -> dict[str, int]:
    """Workers per model, as GET {base}/models on ``host`` lists them ({} if it does not
    answer)."""

    def get() -> dict[str, int]:
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=5) as resp:
                data = json.loads(resp.read())["data"]
        except (OSError, ValueError, KeyError):
            return {}
        return {m["id"]: int(m.get("workers", 0)) for m in data}

    return host.run_here(get, timeout_s=30)


def workers(host: Host, base: str, model: str = MODEL) -> int:
    return models(host, base).get(model, 0)


def embed(host: Host, base: str, texts: list[str], model: str = MODEL) -> tuple[int, dict]:
    """POST {base}/embeddings from ``host``: (status, JSON body)."""

    def post() -> tuple[int, dict]:
        body = json.dumps({"model": model, "input": texts}).encode()
        req = urllib.request.Request(
            f"{base}/embeddings", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    return host.run_here(post, timeout_s=90)

"""``mesh-launch`` run as a user runs it (a real process tree), and /proc helpers to inspect it.

Shared by the supervisor tests and the ingress-processes tests.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

START_S = 150  # the supervisor's own start-up timeout is 120 s
MODEL = "all-MiniLM-L6-v2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command() -> list[str]:
    script = Path(sys.executable).with_name("mesh-launch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "launch.cli"]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc (no psutil)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    """What ``ps`` shows any user: the process's arguments, space-separated."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    """A process's environment (readable by its own user only)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


@dataclass
class Launched:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    stderr: Path

    def first_line(self, timeout_s: float) -> str:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"no line on stdout in {timeout_s}s\n{self.stderr.read_text()[-4000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start(
    tmp_path: Path, *args: str, role: str = "all", env: dict[str, str] | None = None
) -> Launched:
    """``mesh-launch --role ROLE ARGS...``; stdout lines queued, stderr to a file."""
    stderr = tmp_path / f"{role}.err"
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [*launch_command(), "--role", role, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=full_env,
        )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line.rstrip("\n")) for line in proc.stdout], daemon=True
    ).start()
    return Launched(proc, lines, stderr)


def request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: dict | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One request on ``conn`` (kept alive: the same ingress process answers every request of
    one connection); (status, body)."""
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})} if data else dict(headers or {})
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    return resp.status, resp.read()

"""``mesh-bench --spawn``: bring a whole mesh up with ``mesh-launch --role all``, then stop it."""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.host import cmdline, process_tree
from launch.children import die_with_parent

START_TIMEOUT_S = 180.0
URL = re.compile(r" at (http://\S+/v1) ")


def _flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in an argv, if any."""
    if name in args and args.index(name) + 1 < len(args):
        return args[args.index(name) + 1]
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_processes(procs: Sequence[subprocess.Popen[Any]], grace_s: float = 5.0) -> None:
    """SIGTERM every process still running, then SIGKILL those not gone within ``grace_s``
    (one deadline for all of them, not one each)."""
    live = [p for p in procs if p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in live:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class SpawnedMesh:
    """A ``mesh-launch --role all`` subprocess; ``url`` once ``start`` has returned.

    ``--auto-truncate`` is always on: the corpus holds passages over the model's 256 tokens,
    and the baseline (sentence-transformers) truncates them silently too.
    """

    def __init__(self, args: str = "", log_level: str = "WARNING") -> None:
        self.args = shlex.split(args)
        self.log_level = log_level
        self.url = ""
        self.line = ""
        self.proc: subprocess.Popen[str] | None = None
        self._log = Path(tempfile.mkstemp(prefix="embedmesh-bench-", suffix=".log")[1])

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "launch.cli",
            "--role",
            "all",
            "--http-port",
            str(port),
            "--auto-truncate",
            "--log-level",
            self.log_level,
            *self.args,
        ]

    def start(self) -> str:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with self._log.open("w") as log:
            # The supervisor dies with us, and its roles with it: a killed benchmark leaves
            # no mesh behind.
            self.proc = subprocess.Popen(
                self.command(free_port()),
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                preexec_fn=die_with_parent,
            )
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        threading.Thread(target=lambda: [lines.put(x) for x in stdout], daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.line:
            try:
                self.line = lines.get(timeout=0.5).strip()
            except queue.Empty:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"mesh did not come up:\n{self.log_tail()}") from None
        match = URL.search(self.line)
        if match is None:
            self.stop()
            raise RuntimeError(
                f"unexpected line from mesh-launch: {self.line!r}\n{self.log_tail()}"
            )
        self.url = match.group(1)
        return self.url

    def describe(self) -> str:
        """How this mesh was started: the command line (its flags exactly as given, after
        ours) and what it said when it came up."""
        port = self.url.rsplit(":", 1)[-1].split("/")[0] if self.url else "PORT"
        flags = shlex.join(self.command(int(port) if port.isdigit() else 0)[3:])
        return f"mesh-launch {flags}" + (f" -> {self.line}" if self.line else "")

    def broker_frontend(self) -> str | None:
        """The endpoint its broker's clients connect to, read from the broker process's
        command line (``--role all`` picks a private one); None when not found."""
        if self.proc is None:
            return None
        for pid in sorted(process_tree(self.proc.pid)):
            args = cmdline(pid)
            if _flag(args, "--role") == "broker" and _flag(args, "--frontend"):
                return _flag(args, "--frontend")
        return None

    def log_tail(self, chars: int = 3000) -> str:
        return self._log.read_text(errors="replace")[-chars:]

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 30 s; the supervisor's exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode != 0:
            print(
                f"mesh-launch exited with {self.proc.returncode}:\n{self.log_tail()}",
                file=sys.stderr,
            )
        else:
            self._log.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> SpawnedMesh:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

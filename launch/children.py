"""Role processes: start one (the one place that does, for ``--role all``, the ingress group,
tests and bench), copy its output, make it die with its parent, stop a set of them in order.

Children's output is forwarded to our stderr, each line prefixed with the child's name, and
its last lines are kept for messages about it. Children run in their own session (a terminal's
Ctrl-C reaches only the supervisor, so the shutdown keeps its order) and die with us if we are
killed.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event

from mesh.ingress.config import DRAIN_GRACE_S

# How long each stage of a stop may take before SIGKILL. Ingresses: their --drain-grace plus
# DRAIN_MARGIN_S (closing the mesh client, exiting the interpreter; 2..10 is reasonable).
# Workers: WORKER_STOP_S, the time to finish the batches they hold (their compute loop waits
# 10 s for the last one, their link 5 s more). The broker: STOP_GRACE_S.
DRAIN_MARGIN_S = 5.0
WORKER_STOP_S = 20.0
STOP_GRACE_S = 5.0
POLL_S = 0.2
# Set in each child's environment: the child asks the kernel for SIGTERM when we die, then
# checks that we have not died already (see die_with_parent_from_env).
PARENT_PID_ENV = "EMBEDMESH_SUPERVISOR_PID"
TAIL_LINES = 12  # lines of a failed child's output shown to the user
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass
class Child:
    """One role process, how to start it again, its output pump and the tail of its output."""

    name: str
    proc: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0  # restarts in a row: since it last ran STABLE_RUN_S
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    pump: threading.Thread | None = None

    def last_line(self) -> str:
        """What it printed last: for a crash, the exception and its message."""
        return next((line.strip() for line in reversed(self.tail) if line.strip()), "no output")

    def tail_text(self, lines: int = TAIL_LINES) -> str:
        shown = [line for line in self.tail if line.strip()][-lines:]
        return "\n".join(f"  | {line}" for line in shown) or "  | (no output)"


class RoleFailed(Exception):
    """A child exited on its own, or the mesh did not come up in time."""


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded here, in the parent: the child between fork and exec should only make the call.
_LIBC = _load_libc()


def die_with_parent() -> None:
    """Get SIGTERM when the parent dies, even by SIGKILL (Linux): in a child before exec (as a
    ``preexec_fn``), or early in the child itself (``die_with_parent_from_env``)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent_from_env() -> None:
    """In a role process the supervisor started: die with it. Armed here, after exec, rather
    than in a ``preexec_fn``: the supervisor restarts roles while its pump threads run, and a
    ``preexec_fn`` is unsafe in a threaded parent. A parent that died before we armed it is no
    longer our parent, so that case is caught too."""
    parent = os.environ.pop(PARENT_PID_ENV, None)  # not inherited by anything we start
    if parent is None:
        return
    die_with_parent()
    if os.getppid() != int(parent):
        sys.exit(f"embedmesh: the supervisor (pid {parent}) is gone; not starting")


def spawn(commands: dict[str, list[str]], env_for: Callable[[str], dict[str, str]]) -> list[Child]:
    """Start one ``launch.cli`` child per command (name → arguments), each with the
    environment ``env_for(name)``; with the supervisor's ``_respawn``, the one place that starts role
    processes. Pipes buffer what the children print until their pumps start."""
    children = [start_child(name, args, env_for(name)) for name, args in commands.items()]
    for child in children:
        start_pump(child)
    return children


def start_child(name: str, args: list[str], env: dict[str, str]) -> Child:
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**env, PARENT_PID_ENV: str(os.getpid())},
        start_new_session=True,
    )
    return Child(name, proc, args, env)


def start_pump(child: Child) -> None:
    child.pump = threading.Thread(target=_pump, args=(child,), daemon=True)
    child.pump.start()


_stderr_lock = threading.Lock()


def _pump(child: Child) -> None:
    """Copy a child's output to our stderr, prefixed with its name; keep the tail."""
    assert child.proc.stdout is not None
    prefix = f"{child.name:<9}| ".encode()
    for raw in iter(child.proc.stdout.readline, b""):
        child.tail.append(raw.decode(errors="replace").rstrip())
        with _stderr_lock, contextlib.suppress(OSError, ValueError):
            sys.stderr.buffer.write(prefix + raw)
            sys.stderr.buffer.flush()


def check_alive(children: list[Child], when: str) -> None:
    for child in children:
        code = child.proc.poll()
        if code is not None:
            if child.pump is not None:
                child.pump.join(timeout=2)  # let the last lines in
            raise RoleFailed(
                f"the {child.name} process {how_it_ended(code)} {when}: {child.last_line()}\n"
                f"Last lines of its output:\n{child.tail_text()}"
            )


def how_it_ended(code: int) -> str:
    return f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stop_all(
    children: list[Child], drain_grace_s: float = DRAIN_GRACE_S, hurry: Event | None = None
) -> None:
    """Ingresses first (they refuse new requests and finish theirs, which needs the workers
    and the broker still up), then workers (they finish their batches, which needs the
    broker), then the broker; each stage SIGTERM, then SIGKILL after its wait, or at once
    when ``hurry`` is set."""
    stages = [
        ([c for c in children if c.name.startswith("ingress")], drain_grace_s + DRAIN_MARGIN_S),
        ([c for c in children if c.name.startswith("worker")], WORKER_STOP_S),
        ([c for c in children if c.name == "broker"], STOP_GRACE_S),
    ]
    for stage, wait_s in stages:
        _stop_stage(stage, wait_s, hurry or Event())
    for child in children:
        if child.pump is not None:
            child.pump.join(timeout=2)


def _stop_stage(stage: list[Child], wait_s: float, hurry: Event) -> None:
    for child in stage:
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for child in stage:
        while child.proc.poll() is None and time.monotonic() < deadline and not hurry.is_set():
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if child.proc.poll() is None:
            why = "a second signal" if hurry.is_set() else f"not stopped in {wait_s:.0f}s"
            print(f"embedmesh: {child.name}: {why}; killing it", file=sys.stderr, flush=True)
            child.proc.kill()
            child.proc.wait()

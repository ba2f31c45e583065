"""Where ``mesh-bench cluster`` runs a process: a network-namespace host made here
(bench/netns.py), a real host over ssh, or this host (an external host runs roles that others
started, e.g. Kubernetes: nothing is started there). One interface: start a Python module
there, reach the mesh's addresses from there, stop what was started.

Over ssh a role runs as ``ssh -T -o BatchMode=yes TARGET 'sh -c ...'``: the remote shell
starts the module in the background and ends it (SIGTERM) when ssh's standard input closes,
so stopping the ssh client (or the coordinator dying) stops the remote role; a load process
reads its instructions on standard input and ends at its end of input.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from bench import netns
from bench.topology import Host as HostSpec
from bench.topology import Ssh
from launch.children import PARENT_PID_ENV, die_with_parent

T = TypeVar("T")
STOP_GRACE_S = 10.0


@dataclass
class Started:
    """A process started on a place: a role (``what``) or a load process."""

    what: str
    proc: subprocess.Popen[Any]
    ssh: bool
    log: Path | None = None

    def stop_signal(self) -> None:
        """Ask it to stop: SIGTERM here; over ssh, the end of its standard input (the remote
        shell then sends the SIGTERM)."""
        if self.proc.poll() is not None:
            return
        if self.ssh and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                self.proc.send_signal(signal.SIGTERM)
        else:
            self.proc.send_signal(signal.SIGTERM)


def stop_all(started: Sequence[Started], grace_s: float = STOP_GRACE_S) -> None:
    """Ask every process to stop, then kill those still running after ``grace_s`` (one
    deadline for all)."""
    import time

    for s in started:
        s.stop_signal()
    deadline = time.monotonic() + grace_s
    for s in started:
        try:
            s.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()


def ssh_argv(ssh: Ssh, module: str, args: Sequence[str], env: Mapping[str, str],
             stdin_commands: bool = False) -> list[str]:  # fmt: skip
    """The local command that runs ``python -m module args`` on ``ssh.target``.

    ``stdin_commands``: the module reads its instructions on standard input (a load
    process), so it runs in the foreground and ends at its end of input. Otherwise (a role)
    it runs in the background with no input, and the remote shell sends it SIGTERM when
    ssh's standard input closes: the role lives exactly as long as this ssh client.
    """
    assigns = [f"{k}={v}" for k, v in env.items()]
    inner = shlex.join([*(["env", *assigns] if assigns else []), ssh.python, "-m", module, *args])
    prefix = f"{ssh.prefix} " if ssh.prefix else ""
    if stdin_commands:
        script = f"{prefix}exec {inner}"
    else:
        # fd 3 keeps ssh's input for the watcher: a background job's own stdin is /dev/null.
        script = (
            f"exec 3<&0; {prefix}exec {inner} </dev/null & p=$!; "
            "(cat <&3 >/dev/null; kill -TERM $p 2>/dev/null) & wait $p"
        )
    return ["ssh", "-T", "-o", "BatchMode=yes", *ssh.options, ssh.target, "--",
            shlex.join(["sh", "-c", script])]  # fmt: skip


@dataclass
class Place:
    """A host of the topology, ready to start processes on."""

    spec: HostSpec
    address: str
    netns_host: netns.Host | None = None
    started: list[Started] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def argv(self, module: str, args: Sequence[str], stdin_commands: bool = False) -> list[str]:
        """The command that runs ``python -m module args`` on this host, as run from here."""
        if self.spec.kind == "ssh":
            assert self.spec.ssh is not None
            return ssh_argv(self.spec.ssh, module, args, self.spec.env, stdin_commands)
        return [sys.executable, "-m", module, *args]

    def start(self, what: str, module: str, args: Sequence[str], log: Path | None = None,
              stdin_commands: bool = False) -> Started:  # fmt: skip
        """``python -m module args`` on this host; its output to ``log`` (``stdin_commands``:
        standard input and output are pipes for the coordinator)."""
        if self.spec.kind == "external":
            raise RuntimeError(f"{self.name} is external: its roles are started by others")
        argv = self.argv(module, args, stdin_commands)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.spec.env}
        if self.spec.kind != "ssh":
            # The process dies with us (it arms that itself: launch.children), so a killed
            # coordinator leaves no mesh behind.
            env[PARENT_PID_ENV] = str(os.getpid())
        out: IO[bytes] | int = subprocess.PIPE
        if not stdin_commands:
            out = log.open("wb") if log is not None else subprocess.DEVNULL
        kwargs: dict[str, Any] = {
            "stdin": subprocess.PIPE, "stdout": out, "env": env,
            "stderr": log.open("ab") if stdin_commands and log is not None else subprocess.STDOUT,
        }  # fmt: skip
        if self.spec.kind == "ssh":
            kwargs["preexec_fn"] = die_with_parent  # the ssh client; its end ends the role
        if self.netns_host is not None:
            proc = self.netns_host.popen(argv, **kwargs)
        else:
            proc = subprocess.Popen(argv, **kwargs)
        for stream in (kwargs["stdout"], kwargs["stderr"]):
            if hasattr(stream, "close"):
                stream.close()  # the child has its own copy
        started = Started(what, proc, self.spec.kind == "ssh", log)
        self.started.append(started)
        return started

    def reach(self, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
        """``fn()`` where this host's network is: inside its namespace for a netns host,
        here otherwise (an ssh host's addresses must be reachable from this machine)."""
        if self.netns_host is not None:
            return self.netns_host.run_here(fn, timeout_s)
        return fn()

    def enter(self) -> None:
        """Move the calling thread onto this host's network (no-op unless netns)."""
        if self.netns_host is not None:
            netns.enter(self.netns_host.name)


class Places:
    """Every host of a topology made ready: namespaces created for the netns ones;
    ``close`` stops every process and deletes the namespaces, however the run ended."""

    def __init__(self, specs: Sequence[HostSpec]) -> None:
        self.specs = list(specs)
        self.places: dict[str, Place] = {}
        self._netns: netns.Hosts | None = None

    def __enter__(self) -> Places:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Place:
        return self.places[name]

    def open(self) -> None:
        made = [s for s in self.specs if s.kind == "netns"]
        if made:
            why = netns.unavailable()
            if why is not None:
                raise RuntimeError(f"netns hosts cannot be made here: {why}")
            self._netns = netns.Hosts(len(made))
            self._netns.create()
        hosts = iter(self._netns.hosts if self._netns else [])
        for spec in self.specs:
            if spec.kind == "netns":
                host = next(hosts)
                self.places[spec.name] = Place(spec, host.ip, host)
            elif spec.kind == "ssh":
                assert spec.ssh is not None
                address = spec.address or spec.ssh.target.rsplit("@", 1)[-1]
                self.places[spec.name] = Place(spec, address)
            else:  # local, or external (its address is required)
                self.places[spec.name] = Place(spec, spec.address or "127.0.0.1")

    def close(self) -> None:
        stop_all([s for p in reversed(self.places.values()) for s in reversed(p.started)])
        if self._netns is not None:
            self._netns.close()
            self._netns = None

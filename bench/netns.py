"""Hosts made of Linux network namespaces on one machine: N hosts on a private subnet, joined
by a bridge in a "switch" namespace, each with its own address, to run a mesh's roles as if on
separate hosts (TCP, CurveZMQ, a link cut by taking its cable out).

Only namespaces this module creates are touched: every interface is made inside them (veth
pairs created straight into their namespaces), so the root namespace's interfaces and routes
are never changed. Needs root (``ip netns add``); ``unavailable()`` says why not, for a skip.

    with Hosts(3) as hosts:                        # emh<pid>-<n>-h1..h3 at 10.77.0.11..13
        broker = hosts[0].popen(["mesh-launch", "--role", "broker", ...])
        hosts.cut(hosts[1])                        # a silent partition
        hosts.heal(hosts[1])
        hosts[2].run_here(fn)                      # fn() in a thread inside host 3's namespace

A run killed before it tore down leaves namespaces named ``emh<pid>-<n>-...``: the next ``Hosts``
deletes those whose creating process is gone (and kills what still runs in them).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench.spawn import stop_processes

PREFIX = "emh"
SUBNET = "10.77.0"  # /24; host i (from 1) is .10+i
CLONE_NEWNET = 0x40000000
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
T = TypeVar("T")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why network-namespace hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(name: str) -> None:
    """Kill what runs in namespace ``name``, then delete it (with the interfaces inside)."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", name, check=False)


def clean_stale() -> list[str]:
    """Delete namespaces of earlier runs whose creating process is gone; their names."""
    names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
    stale = [n for n in names if (m := _NAME.match(n)) and not _alive(int(m.group(1)))]
    for name in stale:
        _delete_namespace(name)
    return stale


def enter(namespace: str) -> None:
    """Move the calling thread into ``namespace`` (sockets it makes afterwards live there;
    threads it starts afterwards inherit it). Other threads of the process are unaffected."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({namespace}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class Host:
    """One namespace host: its name, its address, the processes started in it."""

    name: str
    ip: str
    port: str  # its cable's end in the switch namespace
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``argv`` run inside this host (``ip netns exec``); killed at teardown."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def run_here(self, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """``fn()`` in a new thread that entered this host's namespace; its result (or its
        exception, raised here)."""
        out: dict[str, Any] = {}

        def main() -> None:
            try:
                enter(self.name)
                out["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread
                out["error"] = exc

        thread = threading.Thread(target=main, name=f"in {self.name}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"{fn!r} in {self.name} still running after {timeout_s}s")
        if "error" in out:
            raise out["error"]
        return out["value"]  # type: ignore[no-any-return]


class Hosts:
    """``n`` hosts on ``SUBNET``.0/24 behind one switch; torn down by ``close`` (or ``with``)."""

    _made_here = itertools.count(1)  # several sets of hosts in one process never share names

    def __init__(self, n: int, prefix: str = PREFIX) -> None:
        self.tag = f"{prefix}{os.getpid()}-{next(Hosts._made_here)}"
        self.switch = f"{self.tag}-sw"
        self.hosts = [
            Host(f"{self.tag}-h{i}", f"{SUBNET}.{10 + i}", f"p{i}") for i in range(1, n + 1)
        ]
        self._made: list[str] = []

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> Hosts:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def create(self) -> None:
        clean_stale()
        for name in (self.switch, *(h.name for h in self.hosts)):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for host in self.hosts:
            # Both ends made inside their namespaces: nothing appears in the root namespace.
            _ip("-n", self.switch, "link", "add", host.port, "type", "veth",
                "peer", "name", "eth0", "netns", host.name)  # fmt: skip
            _ip("-n", self.switch, "link", "set", host.port, "master", "br0")
            _ip("-n", self.switch, "link", "set", host.port, "up")
            _ip("-n", host.name, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", host.name, "link", "set", "eth0", "up")

    def cut(self, host: Host) -> None:
        """Take ``host``'s cable out at the switch: a silent partition (no FIN, no RST; its
        packets and those sent to it are lost until ``heal``)."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def close(self) -> None:
        """Stop every process started in the hosts (SIGTERM, then SIGKILL), delete the
        namespaces; safe to call twice and after a failed ``create``."""
        stop_processes([p for h in self.hosts for p in h.procs])
        for name in reversed(self._made):
            _delete_namespace(name)
        self._made.clear()

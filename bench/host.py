"""How busy the host is with work that is not ours: a 2-core box shared with others skews
every number, so a report says how much CPU other processes took while it measured, and a run
can wait for the host to go quiet first. Linux ``/proc`` only; elsewhere these report nothing.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _busy_idle() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, idle


def _steal_ticks() -> int:
    """CPU time the hypervisor gave to other guests while ours wanted to run (all CPUs)."""
    try:
        return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[8])
    except (OSError, IndexError, ValueError):
        return 0


def busy_share(seconds: float = 3.0) -> float:
    """Fraction of all CPUs busy over the next ``seconds`` (NaN without /proc)."""
    try:
        b0, i0 = _busy_idle()
        time.sleep(seconds)
        b1, i1 = _busy_idle()
    except OSError:
        return math.nan
    total = (b1 - b0) + (i1 - i0)
    return (b1 - b0) / total if total else 0.0


def wait_quiet(max_wait_s: float, threshold: float = 0.15, window_s: float = 3.0) -> float:
    """Until the host is under ``threshold`` busy for one window, or ``max_wait_s`` passed.

    Returns the last busy share measured (so a caller can say it gave up waiting).
    """
    deadline = time.monotonic() + max_wait_s
    share = busy_share(window_s)
    while not share < threshold and time.monotonic() < deadline:
        share = busy_share(window_s)
    return share


def _process_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks used so far) for every process we can read."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def _tree(root: int, procs: dict[int, tuple[int, int]]) -> set[int]:
    found, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in procs.items() if ppid in frontier} - found
        found |= frontier
    return found


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (empty without /proc)."""
    try:
        return _tree(root, _process_ticks())
    except OSError:
        return set()


def cmdline(pid: int) -> list[str]:
    """A process's argv ([] once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _role(pid: int, parent: int | None = None) -> str:
    """What a process of ours is: a mesh role by its mesh-launch flags, or its ``parent``'s
    (an ingress's tokenizer processes count as ingress), else ``bench`` (this process, and
    the load processes of ``--procs`` it started)."""
    args = cmdline(pid)
    if not args:
        return "other"
    if "--role" in args and args.index("--role") + 1 < len(args):
        role = args[args.index("--role") + 1]
        return "supervisor" if role == "all" else role
    if parent is not None:
        role = _role(parent)
        if role not in ("bench", "other", "supervisor"):
            return role
    return "bench"


@dataclass
class CpuUse:
    """CPU used during a window: others' share of all CPUs, and ours in cores per role."""

    others: float  # 0..1 of all CPUs; NaN when unknown
    ours: dict[str, float] = field(default_factory=dict)  # role -> cores (1.0 = one core busy)
    steal: float = math.nan  # 0..1 of all CPUs taken by the hypervisor for other guests


class CpuWatch:
    """CPU taken between ``start`` and ``stop``, by processes outside this one's tree and by
    each role inside it (a spawned mesh is inside).

    A process that both started and ended inside the window is missed: a lower bound.
    """

    def __init__(self) -> None:
        self._before: dict[int, tuple[int, int]] = {}
        self._t0 = 0.0
        self._steal0 = 0

    def start(self) -> None:
        try:
            self._before = _process_ticks()
        except OSError:
            self._before = {}
        self._steal0 = _steal_ticks()
        self._t0 = time.monotonic()

    def stop(self) -> CpuUse:
        elapsed = time.monotonic() - self._t0
        try:
            after = _process_ticks()
        except OSError:
            return CpuUse(math.nan)
        if not self._before or elapsed <= 0:
            return CpuUse(math.nan)
        ours = _tree(os.getpid(), after)
        others = 0
        by_role: dict[str, float] = {}
        for pid, (ppid, used) in after.items():
            ticks = used - self._before.get(pid, (0, 0))[1]
            if pid not in ours:
                others += ticks
            else:
                role = _role(pid, ppid)
                by_role[role] = by_role.get(role, 0.0) + ticks / _TICKS / elapsed
        cpu_s = elapsed * _cpus() * _TICKS
        steal = (_steal_ticks() - self._steal0) / cpu_s
        return CpuUse(max(0.0, others / cpu_s), by_role, steal)

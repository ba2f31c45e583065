"""What a long run watches in the mesh's processes: their memory and whether they are still the
same processes. Shared by ``bench.harness.soak`` and ``bench.harness.fuzz``. Linux ``/proc`` only.

A role that crashed and was restarted by the supervisor shows as a pid that vanished and a new
one of the same role: the supervisor hides the crash from the client (it may cost only a few
503s), so a long run compares pids rather than trusting the error count alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.host import cmdline, process_tree


def rss_kb(pid: int) -> int | None:
    """Resident memory of ``pid`` in KiB (VmRSS), None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None  # a zombie has no VmRSS line


def role_of(pid: int) -> str:
    """A mesh process's role from its ``--role`` flag (``all`` is the supervisor)."""
    args = cmdline(pid)
    if "--role" in args and args.index("--role") + 1 < len(args):
        role = args[args.index("--role") + 1]
        return "supervisor" if role == "all" else role
    return "other"


def mesh_processes(root: int) -> dict[int, str]:
    """pid → role of ``root`` and every process under it (helpers included, as ``other``)."""
    return {pid: role_of(pid) for pid in sorted(process_tree(root))}


@dataclass(frozen=True)
class ProcSample:
    pid: int
    role: str
    rss_kb: int


def sample_processes(roots: list[int]) -> list[ProcSample]:
    """RSS of every live process under ``roots`` (a root that is gone contributes nothing)."""
    out = []
    for root in roots:
        for pid, role in mesh_processes(root).items():
            rss = rss_kb(pid)
            if rss is not None:
                out.append(ProcSample(pid, role, rss))
    return out


def vanished(first: dict[int, str], later: list[dict[int, str]]) -> dict[int, str]:
    """The pids (with their roles) of ``first`` missing from some later sample: each is a
    process that died during the run (a crash, or a restart by the supervisor)."""
    gone: dict[int, str] = {}
    for seen in later:
        gone.update({pid: role for pid, role in first.items() if pid not in seen})
    return gone


def appeared(first: dict[int, str], later: list[dict[int, str]]) -> dict[int, str]:
    """The pids seen later that were not there at first: replacements, or new helpers."""
    new: dict[int, str] = {}
    for seen in later:
        new.update({pid: role for pid, role in seen.items() if pid not in first})
    return new

"""Run a command pinned to some CPUs: ``python -m bench.pin 0,1 -- CMD ARGS...``.

For emulating a small host on a big one (the 2-core CI machine on the GPU host's 16 cores):
the mesh on two cores, the load generator on others, so that the load is never the limit.
Children inherit the affinity. ``taskset`` does the same where util-linux is installed.
"""

from __future__ import annotations

import os
import sys


def parse_cpus(spec: str) -> set[int]:
    """``"0,1"`` or ``"2-9"`` or ``"0,4-5"`` → the set of CPU numbers."""
    cpus: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m bench.pin CPUS -- COMMAND [ARGS...]")
    os.sched_setaffinity(0, parse_cpus(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])

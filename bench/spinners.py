"""Keep every core of the host awake with busy loops at SCHED_IDLE (a probe of issue 8's idle query).

On the H200 machine (a Firecracker guest with no cpuidle driver), a thread woken after a few
milliseconds of idleness waits 100-250 µs for its halted vCPU to come back, and an idle query
crosses a dozen such wakes (``bench/wake_probe.py``). A busy loop under ``SCHED_IDLE`` on each
core keeps the vCPUs out of halt while never taking a core from real work: the scheduler
preempts a SCHED_IDLE task at once for any normal one, and counts its core as idle when it
places a woken thread. This probes how much of the idle query that buys, and what it costs a
saturated mesh:

    python3 -m bench.spinners N        # N spinning processes until killed (0: one per core)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

_SPIN = (
    "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"
)


def start(count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` spinners (0: one per core the process may run on)."""
    count = count or len(os.sched_getaffinity(0))
    return [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(count)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


@contextlib.contextmanager
def spinning(count: int | None) -> Iterator[None]:
    """Spinners for the block's duration; ``None`` starts none."""
    procs = start(count) if count is not None else []
    try:
        yield
    finally:
        stop(procs)


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    # A kill from the script that started this must take the spinners with it: unhandled,
    # SIGTERM ends this process without its ``finally`` and leaves them spinning.
    signal.signal(signal.SIGTERM, _exit)
    procs = start(count)
    try:
        for proc in procs:
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/ingress_profile.py's parsing of mesh-bench's report and its /proc CPU reading."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.ingress_profile import ROW, cpu_seconds


def test_the_request_count_comes_from_the_closed_row_of_the_report() -> None:
    report = (
        "config                     mode    load           ok/sent  req/s  texts/s  tok/s\n"
        "http://127.0.0.1:18555/v1  closed  8 clients x64  853/860  71.1   4444.3   535139\n"
    )
    found = [m.group(1) for line in report.splitlines() if (m := ROW.search(line))]
    assert found == ["853"]  # the answered ones, not the sent


def test_a_process_and_its_childrens_cpu_are_read_apart() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.process_time()\n"
         "while time.process_time() - t < 0.5: pass\ntime.sleep(30)"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20  # a busy host may give the child its CPU late
        while (children := cpu_seconds(os.getpid())[1]) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        own = cpu_seconds(os.getpid())[0]
        assert own > 0 and children >= 0.4  # the child's busy half second, apart from ours
    finally:
        child.kill()
        child.wait()

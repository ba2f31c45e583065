"""mesh-bench's view of the host: whose CPU time is whose."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.host import CpuWatch, _tree, busy_share

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_tree_holds_the_root_and_all_its_descendants_only() -> None:
    procs = {1: (0, 0), 10: (1, 0), 11: (10, 0), 12: (11, 0), 20: (1, 0)}
    assert _tree(10, procs) == {10, 11, 12}


def test_busy_share_is_a_fraction() -> None:
    assert 0.0 <= busy_share(0.2) <= 1.0


def test_a_detached_process_burning_cpu_counts_as_others() -> None:
    watch = CpuWatch()
    watch.start()
    # The shell exits at once, so the burner is re-parented away from our process tree.
    burn = f"{sys.executable} -c 'import time; t = time.time()\nwhile time.time() - t < 1: pass' &"
    subprocess.run(["sh", "-c", burn], check=True)
    time.sleep(1.3)
    # One core busy for ~1 s out of ~1.3 s; other load on the host can only add to it.
    assert watch.stop().others > 0.2


def test_our_own_work_counts_under_our_role_not_as_others() -> None:
    watch = CpuWatch()
    watch.start()
    t = time.perf_counter()
    while time.perf_counter() - t < 0.5:
        pass
    use = watch.stop()
    assert use.ours.get("bench", 0.0) > 0.1


def test_a_helper_process_of_a_role_counts_under_that_role() -> None:
    # A stand-in ingress (its argv names the role) with a child that burns CPU: the child is
    # what an ingress's tokenizer process looks like (no flags of its own).
    child = "import time; t = time.time()\nwhile time.time() - t < 2: pass"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    watch = CpuWatch()
    watch.start()  # counts processes alive at its stop (one that came and went is missed)
    proc = subprocess.Popen([sys.executable, "-c", parent, "--role", "ingress"])
    time.sleep(1.5)
    use = watch.stop()
    proc.wait()
    assert use.ours.get("ingress", 0.0) > 0.2

"""``mesh-bench cluster`` end to end on network-namespace hosts: a broker host, two worker
hosts of null workers and a front host (ingress and two load processes), CURVE on every link
and 20 ms added each way between the front and the broker. The run serves every request, its
figures come from /metrics, the delay shows in the latency, and nothing is left behind; a
role that cannot start fails the run, with its log, and nothing is left behind either.
Skipped where network namespaces are not allowed."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from bench import topology
from bench.cluster_run import ClusterRun
from bench.netns import unavailable

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))

TOPOLOGY = """
name = "two null worker hosts"
heartbeat_interval_s = 0.5
heartbeat_liveness = 4
[load]
concurrency = 4
texts_per_request = 2
duration_s = 3
warmup_s = 1
[hosts.broker]
broker = {}
[hosts.w1]
workers = [{ broker = "broker", engine = "null", flags = "--max-batch-tokens 2048" }]
[hosts.w2]
workers = [{ broker = "broker", engine = "null", flags = "--max-batch-tokens 2048" }]
[hosts.front]
ingress = { brokers = ["broker"], flags = "--ingress-procs 1" }
load_procs = 2
[[links]]
hosts = ["front", "broker"]
delay_ms = 20
"""


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line}


def _one(figures: dict, name: str) -> dict:
    (value,) = [v for k, v in figures.items() if k.startswith(name + "{")]
    return value


@pytest.mark.timeout(300)
def test_a_cluster_run_serves_every_request_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = _namespaces()
    run = ClusterRun(topology.parse(tomllib.loads(TOPOLOGY)), tmp_path / "logs")
    result = run.run()
    stats = result["lanes"]["load"]["stats"]
    assert stats["errors"] == {} and stats["ok"] == stats["requests"] > 10
    assert stats["tokens_per_s"] > 0
    # Each request crosses the delayed link twice (to the broker and back): 40 ms at least.
    assert stats["latency_ms"]["p50"] >= 40
    front = result["metrics"]["front"]
    assert result["delay_by"] in ("netem", "proxy")  # netem where the kernel has it
    assert front["scrapes"] >= 2 and front["failed"] == 0
    assert _one(front["roles"]["broker"], "embedmesh_broker_workers")["last"] == 2
    assert _one(front["roles"]["broker"], "embedmesh_broker_up")["last"] == 1
    assert front["queue_depth"]  # the broker's queue, whatever its series are named now
    roles = [(c["host"], c["role"]) for c in result["roles"]]
    assert roles == [("broker", "broker"), ("w1", "worker-null"), ("w2", "worker-null"),
                     ("front", "ingress")]  # fmt: skip
    assert all("bench.null_worker" in c["command"] for c in result["roles"][1:3])
    assert _namespaces() == before
    assert all(s.proc.poll() is not None for p in run.places.places.values() for s in p.started)


@pytest.mark.timeout(300)
def test_a_role_that_cannot_start_fails_the_run_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = _namespaces()
    broken = TOPOLOGY.replace('flags = "--max-batch-tokens 2048" }]\n[hosts.front]',
                              'flags = "--no-such-flag" }]\n[hosts.front]')  # fmt: skip
    run = ClusterRun(topology.parse(tomllib.loads(broken)), tmp_path / "logs")
    with pytest.raises(RuntimeError, match="worker-null exited with 2") as err:
        run.run()
    assert "No such option '--no-such-flag'" in str(err.value)  # the role's log, in the error
    assert _namespaces() == before
    assert all(s.proc.poll() is not None for p in run.places.places.values() for s in p.started)


def _running_with(text: str) -> list[str]:
    """Command lines of live processes that mention ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and proc.name.isdigit():
            found.append(cmd)
    return found


@pytest.mark.timeout(300)
def test_ctrl_c_during_the_load_tears_every_host_down(tmp_path: Path) -> None:
    import os
    import signal
    import sys
    import time

    small = TOPOLOGY.replace("duration_s = 3", "duration_s = 60")
    small = small.replace('[hosts.w2]\nworkers = [{ broker = "broker", engine = "null", '
                          'flags = "--max-batch-tokens 2048" }]\n', "")  # fmt: skip
    (tmp_path / "t.toml").write_text(small)
    logs = tmp_path / "logs"
    before = _namespaces()
    cmd = [sys.executable, "-m", "bench.cli", "cluster", "--topology", str(tmp_path / "t.toml"),
           "--logs", str(logs)]  # fmt: skip
    bench = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 200
        while not list(logs.glob("row-1/*-load-*.log")):  # the load has started
            assert bench.poll() is None, bench.stdout.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the load never started"
            time.sleep(0.5)
        time.sleep(2)
        assert len(_namespaces() - before) == 4  # the switch and three hosts
        # Ctrl-C, to the coordinator alone (a terminal's reaches the roles too): it must
        # stop every role and load process itself.
        os.kill(bench.pid, signal.SIGINT)
        assert bench.wait(60) != 0
    finally:
        if bench.poll() is None:
            bench.kill()
    assert _namespaces() == before
    assert _running_with(str(logs)) == []  # every role had the run's key folder in its flags

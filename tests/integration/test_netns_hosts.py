"""bench/netns.py's hosts: they reach each other and nothing else changes, a cut cable is a
silent partition, and nothing is left behind, after a failure or a crashed run.
Skipped where network namespaces are not allowed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from bench.netns import Hosts, clean_stale, unavailable

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line}


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _ask(ip: str, port: int, timeout_s: float = 5) -> bytes:
    with socket.create_connection((ip, port), timeout=timeout_s) as conn:
        conn.sendall(b"hi")
        return conn.recv(64)


def test_hosts_talk_over_their_subnet_and_leave_the_root_namespace_alone() -> None:
    root_links = _links()
    with Hosts(2) as hosts:
        assert {hosts.switch, hosts[0].name, hosts[1].name} <= _namespaces()
        assert _links() == root_links  # every interface lives inside our namespaces
        server = hosts[0].popen([sys.executable, "-c", f"""
import socket
s = socket.create_server(("{hosts[0].ip}", 7100)); c, _ = s.accept(); c.sendall(c.recv(64))
"""])  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                assert hosts[1].run_here(lambda: _ask(hosts[0].ip, 7100), 30) == b"hi"
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert server.wait(10) == 0
    assert not {hosts.switch, hosts[0].name, hosts[1].name} & _namespaces()


def test_a_cut_cable_is_silent_and_healing_it_restores_the_link() -> None:
    with Hosts(2) as hosts:
        hosts.cut(hosts[0])
        with pytest.raises(OSError):  # no refusal, no reset: the connection attempt times out
            hosts[1].run_here(lambda: _ask(hosts[0].ip, 7101, timeout_s=1), 30)
        hosts.heal(hosts[0])
        hosts[0].popen([sys.executable, "-c", f"""
import socket
s = socket.create_server(("{hosts[0].ip}", 7101)); c, _ = s.accept(); c.sendall(c.recv(64))
"""])  # fmt: skip
        time.sleep(1)
        assert hosts[1].run_here(lambda: _ask(hosts[0].ip, 7101), 30) == b"hi"


def test_a_failing_test_still_tears_everything_down() -> None:
    hosts = Hosts(1)
    with pytest.raises(RuntimeError), hosts:
        sleeper = hosts[0].popen(["sleep", "300"])
        raise RuntimeError("the test failed")
    assert sleeper.poll() is not None
    assert not {hosts.switch, hosts[0].name} & _namespaces()


def test_namespaces_of_a_crashed_run_are_cleaned_at_the_next_start() -> None:
    crashed = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom bench.netns import Hosts\n"
         "h = Hosts(1); h.create(); print(h.tag, flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert crashed.stdout is not None
    tag = crashed.stdout.readline().strip()
    assert tag and any(name.startswith(f"{tag}-") for name in _namespaces())
    crashed.kill()  # kill -9: no teardown ran
    crashed.wait()
    cleaned = clean_stale()
    assert {f"{tag}-sw", f"{tag}-h1"} <= set(cleaned)
    assert not any(name.startswith(f"{tag}-") for name in _namespaces())

"""``mesh-launch --role all`` under load while its roles are restarted or killed: what is lost.

Each test runs real processes with a few clients posting continuously (``Load``) and prints
its counts (``pytest -s`` shows them; docs/reliability.md quotes them).
"""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spawn import free_port
from tests.integration.launched import (
    START_S,
    Launched,
    Load,
    Outcome,
    base_url,
    role_pids,
    served_workers,
    start,
)

CLIENTS = [4, 4, 4]  # inputs per request of each client


@pytest.fixture
def stop_at_end() -> Iterator[list[Launched]]:
    """Meshes a test started, stopped (SIGTERM, exit 0 expected) or killed at its end."""
    runs: list[Launched] = []
    yield runs
    for run in runs:
        run.kill()


def _mesh(tmp_path: Path, runs: list[Launched], *args: str) -> tuple[Launched, str]:
    run = start(tmp_path, "--http-port", str(free_port()), *args)
    runs.append(run)
    return run, base_url(run.first_line(START_S))


CATALOG_AGE_S = 1.0  # the ingress asks its broker for the catalog every heartbeat (1 s)


def _wait_workers(run: Launched, base: str, n: int, old: set[int]) -> None:
    """Until ``n`` workers serve and one of them is new (not in ``old``, the workers before the
    kill): the restart is complete. "The victim is gone and n are listed" is not enough: the
    ingress's catalog is up to a heartbeat old, so it can still list the victim before its
    successor has registered, and killing the next one then leaves none (503s)."""
    deadline = time.monotonic() + START_S
    new_since: float | None = None
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, run.stderr.read_text()[-3000:]
        if new_since is None and role_pids(run.proc.pid, "worker") - old:
            new_since = time.monotonic()
        # Two heartbeats after the successor started, the catalog no longer lists the victim.
        fresh = new_since is not None and time.monotonic() - new_since > 2 * CATALOG_AGE_S
        if fresh and served_workers(base) >= n:
            return
        time.sleep(0.2)
    pytest.fail(f"{n} workers never served again\n{run.stderr.read_text()[-3000:]}")


def _back(load: Load, since: float, count: int = 3, timeout_s: float = START_S) -> float:
    """Until ``count`` requests sent after ``since`` ended ok; seconds from ``since`` to the
    first of them (the time to recovery)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok = sorted(o.ended for o in list(load.outcomes) if o.kind == "ok" and o.started > since)
        if len(ok) >= count:
            return ok[0] - since
        time.sleep(0.1)
    pytest.fail(f"the service did not come back: {load.summary()}")


def _in_flight(outcomes: list[Outcome], at: float) -> list[Outcome]:
    return [o for o in outcomes if o.started < at < o.ended]


def _stop(run: Launched) -> None:
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=120) == 0, run.stderr.read_text()[-3000:]


def test_rolling_restart_of_two_workers_under_load_loses_nothing(
    tmp_path: Path, stop_at_end: list[Launched]
) -> None:
    run, base = _mesh(tmp_path, stop_at_end, "--workers", "2", "--threads", "1")
    with Load(base, CLIENTS) as load:
        load.wait_for(5)
        for _ in range(2):
            old = role_pids(run.proc.pid, "worker")
            victim = min(old)
            os.kill(victim, signal.SIGTERM)  # the supervisor starts it again
            _wait_workers(run, base, 2, old)
            _back(load, time.monotonic())
        outcomes = load.stop()
    _stop(run)
    print(f"\nrolling restart of 2 workers: {load.summary()}")
    assert not load.errors() and not load.count("refused"), load.summary()
    assert len(outcomes) >= 10
    assert run.stderr.read_text().count("embedmesh: restarted worker-") == 2


def test_kill_9_of_the_only_worker_under_load_loses_nothing_in_flight(
    tmp_path: Path, stop_at_end: list[Launched]
) -> None:
    run, base = _mesh(tmp_path, stop_at_end)
    with Load(base, CLIENTS) as load:
        load.wait_for(5)
        (worker,) = role_pids(run.proc.pid, "worker")
        killed = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        recovery_s = _back(load, killed)
        outcomes = load.stop()
    _stop(run)
    held = _in_flight(outcomes, killed)
    print(f"\nkill -9 of the only worker: {load.summary()}; {len(held)} in flight at the kill; "
          f"back after {recovery_s:.1f}s")  # fmt: skip
    # Requests the dead worker held wait in the broker for the restarted one; requests that
    # came while no worker served were refused with a clean 503; nothing else.
    assert held and all(o.kind == "ok" for o in held), held
    assert not load.errors(), load.errors()[:5]
    assert "requeueing" in run.stderr.read_text()


def test_work_of_a_worker_that_vanished_waits_for_it_to_come_back(
    tmp_path: Path, stop_at_end: list[Launched]
) -> None:
    """The broker holds a workerless model's queued work (--orphan-grace, under --role all the
    request timeout) rather than failing it one heartbeat expiry after the worker left. A
    stopped worker (SIGSTOP) is buried by the broker after 3 s of silence and, continued 10 s
    later, registers again: unlike a restart, this does not depend on how fast a model loads."""
    run, base = _mesh(tmp_path, stop_at_end)
    with Load(base, CLIENTS) as load:
        load.wait_for(5)
        (worker,) = role_pids(run.proc.pid, "worker")
        stopped = time.monotonic()
        os.kill(worker, signal.SIGSTOP)
        time.sleep(10)  # > one heartbeat expiry (3 s) + the broker's own orphan default (3 s)
        os.kill(worker, signal.SIGCONT)
        recovery_s = _back(load, stopped)
        outcomes = load.stop()
    _stop(run)
    held = _in_flight(outcomes, stopped)
    print(f"\nworker stopped for 10 s: {load.summary()}; {len(held)} in flight; "
          f"back after {recovery_s:.1f}s")  # fmt: skip
    assert held and all(o.kind == "ok" for o in held), held
    assert not load.errors(), load.errors()[:5]
    assert "requeueing" in run.stderr.read_text()


def test_kill_9_of_an_ingress_process_leaves_the_other_serving(
    tmp_path: Path, stop_at_end: list[Launched]
) -> None:
    run, base = _mesh(tmp_path, stop_at_end, "--ingress-procs", "2")
    clients = [4] * 6  # kept-alive connections, spread over both processes by the kernel
    with Load(base, clients) as load:
        load.wait_for(10)
        victim = min(role_pids(run.proc.pid, "ingress"))
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        recovery_s = _back(load, killed, count=10)
        outcomes = load.stop()
    _stop(run)
    print(f"\nkill -9 of one of 2 ingress processes: {load.summary()}; first ok after the kill "
          f"in {recovery_s:.1f}s")  # fmt: skip
    # Only requests on the dead process's own connections are lost: one per client at most,
    # the one it had in flight or sent just as the process died (then it reconnects, to the
    # survivor or the restarted process).
    lost = load.errors()
    per_client = collections.Counter(o.client for o in lost)
    assert all(n == 1 for n in per_client.values()), lost
    later = [o for o in outcomes if o.started > killed + 1.0 and o.kind != "ok"]
    assert not later, f"{load.summary()}: {later[:5]}"
    assert "restarting ingress-" in run.stderr.read_text()


def test_kill_9_of_the_broker_fails_in_flight_requests_with_503_and_the_service_comes_back(
    tmp_path: Path, stop_at_end: list[Launched]
) -> None:
    run, base = _mesh(tmp_path, stop_at_end)
    with Load(base, CLIENTS) as load:
        load.wait_for(5)
        (broker,) = role_pids(run.proc.pid, "broker")
        killed = time.monotonic()
        os.kill(broker, signal.SIGKILL)
        recovery_s = _back(load, killed)
        outcomes = load.stop()
    _stop(run)
    held = _in_flight(outcomes, killed)
    answered_s = max((o.ended - killed for o in held), default=0.0)
    print(f"\nkill -9 of the broker: {load.summary()}; {len(held)} in flight at the kill, all "
          f"answered within {answered_s:.1f}s; back after {recovery_s:.1f}s")  # fmt: skip
    # The broker's queue died with it: what it held is answered 503 (or finished, if its
    # result was already on its way), never dropped or left hanging.
    assert held and all(o.kind in ("ok", "refused") for o in held), held
    assert not load.errors(), load.errors()[:5]

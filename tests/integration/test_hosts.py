"""A mesh across hosts made of network namespaces (bench/netns.py): each role on a host of its
own address, every link TCP, CURVE on every link. Faults between hosts: a worker host cut off
under load, a broker host's broker killed and restarted, an ingress given two broker hosts.

Skipped where network namespaces are not allowed (the fixture says why); the same failure
logic runs on every machine through the fault proxy (test_link_faults.py). ``pytest -s``
prints the times measured.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest

from bench.faultproxy import FaultProxy
from bench.netns import Host
from tests.hosts import BACK, FRONT, HOST_LIVENESS, HostMesh, embed, models, workers
from tests.integration.launched import MODEL, Load

START_S = 120
SLACK_S = 3.0  # a loaded 2-core machine
CLIENTS = [4, 4, 4]
INFLIGHT = re.compile(r'^embedmesh_broker_inflight_batches\{broker="([^"]+)"\} ([\d.e+]+)')


def _until(check: Callable[[], bool], timeout_s: float, what: str, mesh: HostMesh) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"{what} not within {timeout_s}s\n{mesh.logs()}")
        time.sleep(0.1)
    return time.monotonic() - started


def _back(load: Load, since: float, mesh: HostMesh, count: int = 3) -> float:
    """Seconds from ``since`` until the first of ``count`` requests sent after it ended ok."""

    def ok() -> list[float]:
        return sorted(o.ended for o in list(load.outcomes) if o.kind == "ok" and o.started > since)

    _until(lambda: len(ok()) >= count, START_S, "service back", mesh)
    return ok()[0] - since


def test_a_worker_host_cut_off_under_load_loses_nothing_and_rejoins(
    host_mesh: Callable[..., HostMesh],
) -> None:
    mesh = host_mesh(4)  # broker, two worker hosts, ingress (and its clients)
    broker, cut, other, front = mesh.hosts.hosts
    mesh.broker(broker, "--orphan-grace", "60")
    mesh.worker(cut, broker)
    mesh.worker(other, broker)
    base = mesh.ingress(front, [broker])
    _until(lambda: workers(front, base) == 2, START_S, "two workers", mesh)
    with Load(base, CLIENTS, netns=front.name) as load:
        load.wait_for(5)
        mesh.hosts.cut(cut)
        cut_at = time.monotonic()
        detected_s = _until(lambda: workers(front, base) == 1, 30, "the cut seen", mesh)
        _back(load, time.monotonic(), mesh)
        mesh.hosts.heal(cut)
        rejoined_s = _until(lambda: workers(front, base) == 2, 60, "the rejoin", mesh)
        _back(load, time.monotonic(), mesh)
        load.stop()
    print(f"\nworker host cut off: {load.summary()}; seen at the ingress in {detected_s:.2f}s "
          f"(window {HOST_LIVENESS.expiry_s:.1f}s + a catalog poll), rejoined {rejoined_s:.2f}s "
          f"after the heal, {time.monotonic() - cut_at:.0f}s in all")  # fmt: skip
    assert not load.errors() and not load.count("refused"), load.summary()
    assert "requeueing" in mesh.logs(tail=100_000)
    # The broker buries it one window after its last word; the ingress's catalog is one
    # heartbeat older at most, and this poll another tenth of a second.
    assert detected_s <= HOST_LIVENESS.expiry_s + 2 * HOST_LIVENESS.interval_s + SLACK_S


def test_a_slow_link_between_hosts_keeps_results_right(
    host_mesh: Callable[..., HostMesh],
) -> None:
    """The worker host reaches its broker through a fault proxy on its own loopback (netem is
    not in every kernel): 2 ms and 20 ms each way, the vectors stay those of the fast link."""
    mesh = host_mesh(3)
    broker, worker, front = mesh.hosts.hosts
    mesh.broker(broker)
    proxy = worker.run_here(lambda: FaultProxy((broker.ip, BACK)).run_in_thread(), 30)
    try:
        mesh.worker(worker, broker, via=proxy.endpoint)
        base = mesh.ingress(front, [broker])
        _until(lambda: workers(front, base) == 1, START_S, "a worker", mesh)
        texts = [f"a slow link between hosts, text {i}" for i in range(16)]
        status, fast = embed(front, base, texts)
        assert status == 200, fast
        for delay_ms in (2.0, 20.0):
            proxy.set_mode("delay", delay_ms=delay_ms)
            status, slow = embed(front, base, texts)
            assert status == 200, slow
            for a, b in zip(fast["data"], slow["data"], strict=True):
                assert np.allclose(a["embedding"], b["embedding"], atol=1e-5)
        assert proxy.accepted >= 1  # the worker's link really ran through it
    finally:
        proxy.stop_thread()


def test_a_killed_broker_fails_pending_requests_with_503_and_serves_again_when_restarted(
    host_mesh: Callable[..., HostMesh],
) -> None:
    mesh = host_mesh(3, curve=False)  # --insecure links: the plain-TCP case
    broker, worker, front = mesh.hosts.hosts
    proc = mesh.broker(broker)
    mesh.worker(worker, broker)
    base = mesh.ingress(front, [broker])
    _until(lambda: workers(front, base) == 1, START_S, "a worker", mesh)
    with Load(base, CLIENTS, netns=front.name) as load:
        load.wait_for(5)
        proc.send_signal(signal.SIGKILL)  # its host's kernel closes its connections
        killed = time.monotonic()
        proc.wait()
        time.sleep(3)  # down for longer than the liveness window (2 s): every link gave up
        restarted = time.monotonic()
        mesh.broker(broker)
        back_s = _back(load, restarted, mesh)
        outcomes = load.stop()
    held = [o for o in outcomes if o.started < killed < o.ended]
    answered_s = max((o.ended - killed for o in held), default=0.0)
    print(f"\nbroker host's broker killed: {load.summary()}; {len(held)} in flight answered "
          f"within {answered_s:.2f}s; served again {back_s:.2f}s after its restart")  # fmt: skip
    assert held and all(o.kind in ("ok", "refused") for o in held), held
    assert not load.errors(), load.errors()[:5]
    assert answered_s <= 3.0  # a closed connection: 503 at once, not after the window


def test_an_ingress_given_two_broker_hosts_spreads_load_routes_by_model_and_fails_over(
    host_mesh: Callable[..., HostMesh],
) -> None:
    mesh = host_mesh(5)
    broker_a, broker_b, worker_a, worker_b, front = mesh.hosts.hosts
    proc_a = mesh.broker(broker_a)
    mesh.broker(broker_b)
    mesh.worker(worker_a, broker_a)
    mesh.worker(worker_b, broker_b)
    mesh.worker(worker_b, broker_b, "--served-name", "only-b")
    base = mesh.ingress(front, [broker_a, broker_b])
    _until(
        lambda: models(front, base).get(MODEL) == 2 and models(front, base).get("only-b") == 1,
        START_S, "both brokers' workers", mesh,
    )  # fmt: skip
    status, body = embed(front, base, ["a model only broker b serves"], model="only-b")
    assert status == 200 and len(body["data"][0]["embedding"]) == 384, body
    with Load(base, [2] * 6, netns=front.name) as load:
        load.wait_for(30)
        busy = _busy_brokers(front, base, samples=20)
        proc_a.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _back(load, killed + 1.0, mesh, count=10)
        outcomes = load.stop()
    after = [o for o in outcomes if o.started > killed + 1.0]
    print(f"\ntwo broker hosts, one killed: {load.summary()}; batches in flight seen at "
          f"{sorted(busy)}; {len(after)} requests after the kill")  # fmt: skip
    # Both brokers had batches in flight under load: the ingress spread its requests.
    assert busy == {f"tcp://{b.ip}:{FRONT}" for b in (broker_a, broker_b)}, busy
    assert not load.errors(), load.errors()[:5]
    assert after and all(o.kind == "ok" for o in after), load.summary()


def _busy_brokers(front: Host, base: str, samples: int) -> set[str]:
    """The brokers /metrics showed with batches in flight, over ``samples`` scrapes."""
    url = base.removesuffix("/v1") + "/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read().decode()

    busy: set[str] = set()
    for _ in range(samples):
        for line in front.run_here(scrape, timeout_s=30).splitlines():
            match = INFLIGHT.match(line)
            if match and float(match.group(2)) > 0:
                busy.add(match.group(1))
        time.sleep(0.1)
    return busy

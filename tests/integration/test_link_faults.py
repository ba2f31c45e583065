"""Faults on one link of a real mesh over TCP, made by the fault proxy (bench/faultproxy.py):
a silent partition, a slow link, a connection that closes. Loopback only: every machine runs
these; tests/integration/test_hosts.py runs the same faults between network-namespace hosts.

Outcomes are asserted; times only against the bounds the design promises (the liveness
window, plus slack for a loaded 2-core machine). ``pytest -s`` prints the times measured.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.faultproxy import FaultProxy
from mesh.client import MeshClient
from mesh.config import Liveness
from mesh.errors import Unavailable
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers
from tests.integration.test_reliability import corpus_texts

# A long window (6 s), so that "at once" (a closed connection) and "after the window" (silence)
# are told apart on a loaded machine.
SLOW_LIVENESS = Liveness(1.0, 6)
SLACK_S = 3.0  # a loaded 2-core machine: processes scheduled late, pongs a second apart


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


@pytest.fixture
def proxies() -> Iterator[Callable[[str], FaultProxy]]:
    """Starts a proxy in front of an endpoint (``tcp://127.0.0.1:PORT``); stopped at the end."""
    started: list[FaultProxy] = []

    def make(endpoint: str) -> FaultProxy:
        proxy = FaultProxy(("127.0.0.1", _port(endpoint))).run_in_thread()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop_thread()


def _workers(client: MeshClient) -> int:
    stats = client.brokers[0].stats
    return 0 if stats is None else stats.workers.get(MODEL, 0)


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``check()`` holds; fails after ``timeout_s``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what} not within {timeout_s}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_a_worker_partitioned_under_load_is_buried_in_the_liveness_window_and_rejoins(
    tmp_path: Path, proxies: Callable[[str], FaultProxy]
) -> None:
    mesh = Mesh(tmp_path, transport="tcp")
    try:
        mesh.start_broker("--orphan-grace", "60")
        link = proxies(mesh.backend)
        mesh.start_worker(broker=link.endpoint)  # the host to be cut off
        mesh.start_worker()
        client_liveness = Liveness(TEST_LIVENESS.interval_s, 4 * TEST_LIVENESS.liveness)
        async with MeshClient(mesh.frontend, liveness=client_liveness) as client:
            await wait_for_workers(client, 2)
            texts = corpus_texts(300)
            direct = await client.embed(texts, MODEL, timeout_s=120, truncate=True)
            calls = [
                asyncio.create_task(client.embed([t], MODEL, timeout_s=120, truncate=True))
                for t in texts
            ]
            while sum(c.done() for c in calls) < 20:
                await asyncio.sleep(0.01)
            link.set_mode("drop")
            detected_s = await _until(lambda: _workers(client) == 1, 30, "the partition seen")
            results = await asyncio.gather(*calls, return_exceptions=True)
            link.set_mode("pass")
            rejoined_s = await _until(lambda: _workers(client) == 2, 60, "the rejoin")
            after = await client.embed(texts[:50], MODEL, timeout_s=60, truncate=True)
    finally:
        mesh.stop()
    print(f"\npartition: seen by the broker's clients in {detected_s:.2f}s (liveness window "
          f"{TEST_LIVENESS.expiry_s:.1f}s, stats every {TEST_LIVENESS.interval_s}s); rejoined "
          f"{rejoined_s:.2f}s after the link healed")  # fmt: skip
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} lost, first {failures[0]!r}\n{mesh.logs()}"
    # Sequence by sequence, the vectors of the partitioned run are the direct path's.
    got = np.concatenate([r.embeddings for r in results])  # type: ignore[union-attr]
    assert np.allclose(got, direct.embeddings, atol=1e-5)
    assert np.allclose(after.embeddings, direct.embeddings[:50], atol=1e-5)
    assert re.search(r"removed \(silent for [\d.]+s\); requeueing [1-9]", mesh.logs()), mesh.logs()
    assert detected_s <= TEST_LIVENESS.expiry_s + 2 * TEST_LIVENESS.interval_s + SLACK_S


async def test_a_slow_link_keeps_results_equal_to_the_direct_path(
    tmp_path: Path, proxies: Callable[[str], FaultProxy]
) -> None:
    mesh = Mesh(tmp_path, transport="tcp")
    try:
        mesh.start_broker()
        back = proxies(mesh.backend)
        front = proxies(mesh.frontend)
        mesh.start_worker(broker=back.endpoint)
        texts = corpus_texts(40)
        async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as direct_client:
            await wait_for_workers(direct_client, 1)
            direct = await direct_client.embed(texts, MODEL, timeout_s=60, truncate=True)
        latency: dict[float, float] = {}
        async with MeshClient(front.endpoint, liveness=TEST_LIVENESS) as client:
            await wait_for_workers(client, 1)
            for delay_ms in (0.0, 2.0, 20.0):
                for proxy in (front, back):
                    proxy.set_mode("delay", delay_ms=delay_ms)
                await asyncio.sleep(0.3)
                result = await client.embed(texts, MODEL, timeout_s=60, truncate=True)
                assert np.allclose(result.embeddings, direct.embeddings, atol=1e-5)
                ones = []
                for text in texts[:15]:
                    started = time.perf_counter()
                    await client.embed([text[:60]], MODEL, timeout_s=60, truncate=True)
                    ones.append(time.perf_counter() - started)
                latency[delay_ms] = statistics.median(ones) * 1000
    finally:
        mesh.stop()
    print("\none short query, two delayed links (ingress-broker, broker-worker), median ms: "
          + ", ".join(f"+{d:g} ms each way: {ms:.1f}" for d, ms in latency.items()))  # fmt: skip
    # Each link's delay is paid twice (there and back), on two links: at least 4x the delay.
    assert latency[20.0] >= 80.0


async def test_a_killed_worker_is_buried_at_once_a_silent_one_after_the_liveness_window(
    tmp_path: Path, proxies: Callable[[str], FaultProxy]
) -> None:
    mesh = Mesh(tmp_path, transport="tcp", liveness=SLOW_LIVENESS)
    try:
        mesh.start_broker("--orphan-grace", "60")
        victim = mesh.start_worker()
        link = proxies(mesh.backend)
        mesh.start_worker(broker=link.endpoint)
        async with MeshClient(mesh.frontend, liveness=Liveness(0.25, 40)) as client:
            await wait_for_workers(client, 2)
            os.kill(victim.pid, signal.SIGKILL)  # its host's kernel closes the connection
            killed_s = await _until(lambda: _workers(client) == 1, 30, "the killed worker gone")
            link.set_mode("drop")  # the process lives; nothing reaches it, nothing closes
            silent_s = await _until(lambda: _workers(client) == 0, 30, "the silent worker gone")
    finally:
        mesh.stop()
    print(f"\nworker links, liveness window {SLOW_LIVENESS.expiry_s:.0f}s: killed worker buried "
          f"in {killed_s:.2f}s, silent one in {silent_s:.2f}s")  # fmt: skip
    logs = mesh.logs()
    assert "removed (its connection closed)" in logs, logs
    assert "removed (silent for" in logs, logs
    assert killed_s < SLOW_LIVENESS.expiry_s / 2
    assert SLOW_LIVENESS.expiry_s - SLOW_LIVENESS.interval_s <= silent_s
    assert silent_s <= SLOW_LIVENESS.expiry_s + SLACK_S


async def test_a_client_fails_its_requests_at_once_when_its_broker_link_closes(
    tmp_path: Path, proxies: Callable[[str], FaultProxy]
) -> None:
    """A closed link (reset) fails the requests it carried at once, and the link comes back;
    a silent one (drop) fails them after the client's liveness window."""
    mesh = Mesh(tmp_path, transport="tcp")
    try:
        mesh.start_broker("--orphan-grace", "60")
        mesh.start_worker(hang_after=0)  # nothing completes: requests stay pending
        front = proxies(mesh.frontend)
        async with MeshClient(front.endpoint, liveness=SLOW_LIVENESS) as client:
            await wait_for_workers(client, 1)
            times = {}
            for mode in ("reset", "drop"):
                calls = [asyncio.create_task(client.embed([f"held {i}"], MODEL)) for i in range(3)]
                await asyncio.sleep(0.5)
                assert not any(c.done() for c in calls)
                front.set_mode(mode)  # type: ignore[arg-type]
                started = time.monotonic()
                results = await asyncio.gather(*calls, return_exceptions=True)
                times[mode] = time.monotonic() - started
                assert all(isinstance(r, Unavailable) for r in results), results
                front.set_mode("pass")
                await _until(lambda: client.brokers[0].alive, 30, "the link back")
    finally:
        mesh.stop()
    print(f"\nbroker link, client liveness window {SLOW_LIVENESS.expiry_s:.0f}s: requests failed "
          f"{times['reset']:.2f}s after a reset, {times['drop']:.2f}s after a silent partition")  # fmt: skip
    assert times["reset"] < SLOW_LIVENESS.expiry_s / 2
    assert SLOW_LIVENESS.expiry_s - SLOW_LIVENESS.interval_s <= times["drop"]
    assert times["drop"] <= SLOW_LIVENESS.expiry_s + 2 * SLOW_LIVENESS.interval_s + SLACK_S

"""A client given two brokers on this host (the ingress's link, MeshClient): it spreads load
over both, routes a model to the broker whose workers serve it, and fails over when one dies.
tests/integration/test_hosts.py holds the same guarantee across namespace hosts, over HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mesh.client import MeshClient
from mesh.config import Liveness
from mesh.errors import Unavailable
from tests.integration.conftest import MODEL, Mesh, wait_for_workers

ONLY_B = "only-b"
# The client's window is long (6 s): a killed broker is seen by its closed connection, not by
# the window running out.
CLIENT_LIVENESS = Liveness(0.25, 24)


@pytest.fixture
def two_meshes(tmp_path: Path) -> Iterator[tuple[Mesh, Mesh]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    meshes = (Mesh(tmp_path / "a", transport="tcp"), Mesh(tmp_path / "b", transport="tcp"))
    yield meshes
    for mesh in meshes:
        mesh.stop()


async def _models_served(client: MeshClient, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        served = {m.name: m.workers for m in client.models()}
        if served.get(MODEL) == 2 and served.get(ONLY_B) == 1:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"not every worker registered: {client.models()}")


async def _spread(client: MeshClient, model: str, requests: int) -> set[int]:
    """Runs ``requests`` concurrent requests of ``model``; the brokers (by index) that held
    outstanding work meanwhile."""
    busy: set[int] = set()
    calls = [
        asyncio.create_task(client.embed([f"spread {i} " * 20], model, timeout_s=60))
        for i in range(requests)
    ]
    while not all(c.done() for c in calls):
        busy |= {i for i, b in enumerate(client.brokers) if b.outstanding_tokens > 0}
        await asyncio.sleep(0.005)
    for call in calls:
        assert call.result().embeddings.shape == (1, 384)
    return busy


async def test_two_brokers_share_load_route_by_model_and_fail_over(
    two_meshes: tuple[Mesh, Mesh],
) -> None:
    a, b = two_meshes
    a.start_broker()
    b.start_broker()
    a.start_worker()
    b.start_worker()
    b.start_worker("--served-name", ONLY_B)
    async with MeshClient([a.frontend, b.frontend], liveness=CLIENT_LIVENESS) as client:
        await wait_for_workers(client, 2)
        await _models_served(client)
        assert await _spread(client, MODEL, 40) == {0, 1}
        assert await _spread(client, ONLY_B, 20) == {1}  # only broker b's workers serve it
        held = [
            asyncio.create_task(client.embed([f"held {i} " * 50], MODEL, timeout_s=60))
            for i in range(30)
        ]
        deadline = time.monotonic() + 30
        while client.brokers[0].outstanding_tokens == 0:  # broker a holds some of them
            assert time.monotonic() < deadline and not all(h.done() for h in held)
            await asyncio.sleep(0.005)
        a.broker.kill()  # type: ignore[union-attr]
        killed = time.monotonic()
        results = await asyncio.gather(*held, return_exceptions=True)
        answered_s = time.monotonic() - killed
        assert all(not isinstance(r, BaseException) or isinstance(r, Unavailable) for r in results)
        assert not client.brokers[0].alive
        after = await asyncio.gather(
            *(client.embed([f"after {i}"], MODEL, timeout_s=60) for i in range(20))
        )
    refused = sum(isinstance(r, Unavailable) for r in results)
    print(f"\ntwo brokers, one killed: {refused} of 30 held requests refused (503), all "
          f"answered within {answered_s:.2f}s; then {len(after)} of 20 served by the other")  # fmt: skip
    assert answered_s < CLIENT_LIVENESS.expiry_s / 2
    assert all(r.embeddings.shape == (1, 384) for r in after)

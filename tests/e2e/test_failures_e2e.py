"""Failures behind the REST bridge: a lost broker, a model whose last worker died, a SIGTERM.

These tests break their mesh, so the module has its own (a broker, one worker, one ingress).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.e2e.conftest import API_KEY, AUTH, MODEL, TEST_LIVENESS, Ingress, Mesh, big_token_request


@pytest.fixture(scope="module")
def fragile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, Ingress]]:
    mesh = Mesh(tmp_path_factory.mktemp("fragile-mesh"))
    mesh.start_broker()
    mesh.start_worker()
    ingress = Ingress(mesh, "--api-key", API_KEY)
    ingress.wait_health()
    yield mesh, ingress
    ingress.stop()
    mesh.stop()


async def post(url: str, body: dict) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession(headers=AUTH) as http,
        http.post(f"{url}/v1/embeddings", json=body) as resp,
    ):
        return resp.status, await resp.json()


async def test_sigterm_lets_in_flight_requests_finish_then_exits_cleanly(
    fragile: tuple[Mesh, Ingress],
) -> None:
    mesh, _ = fragile
    ingress = Ingress(mesh)  # a second one, to stop
    try:
        await asyncio.to_thread(ingress.wait_health)
        call = asyncio.create_task(post(ingress.url, big_token_request(16, seed=12)))
        await asyncio.sleep(0.3)
        assert not call.done()  # 4096 tokens: about a second of work on 2 cores
        ingress.proc.terminate()
        status, doc = await call
        assert status == 200 and len(doc["data"]) == 16
        assert await asyncio.to_thread(ingress.proc.wait, 15) == 0
        assert "ingress stopped" in mesh.logs()
    finally:
        ingress.stop()


async def test_a_lost_broker_fails_in_flight_requests_with_503_then_recovers(
    fragile: tuple[Mesh, Ingress],
) -> None:
    mesh, ingress = fragile
    pending = asyncio.create_task(post(ingress.url, big_token_request(300, seed=11)))
    await asyncio.sleep(1.0)  # submitted, and far from done
    assert not pending.done()
    mesh.broker.kill()  # type: ignore[union-attr]
    killed_at = time.monotonic()
    status, doc = await pending
    assert status == 503 and doc["error"]["code"] == "unavailable", doc
    assert "lost the broker" in doc["error"]["message"]
    assert time.monotonic() - killed_at < TEST_LIVENESS.expiry_s + 2.0  # never a hang
    status, doc = await post(ingress.url, {"model": MODEL, "input": "while it is down"})
    assert status == 503 and "no broker" in doc["error"]["message"]
    code, health = ingress.health()
    assert code == 503 and health["reason"] == "no broker is reachable"
    mesh.broker.wait()  # type: ignore[union-attr]
    mesh.start_broker()  # same endpoints: the worker and the ingress find it again
    await asyncio.to_thread(ingress.wait_health, 200, 60)
    status, doc = await post(ingress.url, {"model": MODEL, "input": "the broker is back"})
    assert status == 200, doc


async def test_a_model_whose_last_worker_died_is_503_and_health_turns_red(
    fragile: tuple[Mesh, Ingress],
) -> None:
    mesh, ingress = fragile
    await asyncio.to_thread(ingress.wait_health, 200, 60)
    for worker in mesh.workers:
        worker.kill()
    body = await asyncio.to_thread(ingress.wait_health, 503, 30)
    assert body["reason"] == f"no worker serves {MODEL}" and body["models"] == {MODEL: 0}
    status, doc = await post(ingress.url, {"model": MODEL, "input": "anyone there?"})
    assert status == 503 and doc["error"]["code"] == "unavailable", doc
    assert "no worker" in doc["error"]["message"]

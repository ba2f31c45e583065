"""Readiness vs liveness, and each broker's and worker's state in /health and /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from proto_msgs import BrokerStats
from proto_msgs.stats import WAIT_BUCKETS_S, LaneStats, ModelStats, WorkerStats
from tests.unit.ingress.test_ingress_app import FakeClient, serve


def _stats() -> BrokerStats:
    """A broker with queued work on both lanes, counters, one busy and one gone worker."""
    waits = [0] * (len(WAIT_BUCKETS_S) + 1)
    waits[0], waits[-1] = 2, 1
    return BrokerStats(
        queued_tokens={"tiny": 40}, queued_sequences={"tiny": 5}, workers={"tiny": 1},
        inflight_batches=2, drain_rate={"tiny": 80.0},
        models={
            "tiny": ModelStats(
                lanes=[LaneStats(1, 8, 10, 70, waits, 130.5), LaneStats(4, 32, 3, 90)],
                batches=6, batch_tokens=160, batch_budget_tokens=384, queued_s=0.5,
            )
        },
        worker_list=[
            WorkerStats("0a", "host:cpu", "tiny", "cpu", "busy", inflight_batches=2, credits=2,
                        tokens_per_s=80.0, batches_done=6, tokens_done=160, since_s=0.2),
            WorkerStats("0b", "host:cpu", "tiny", "cpu", "down", since_s=3.0,
                        reason="its connection closed"),
        ],
    )  # fmt: skip


@pytest.fixture
def fake() -> FakeClient:
    client = FakeClient()
    client.brokers[0].stats = _stats()
    return client


@pytest.fixture
async def http(fake: FakeClient) -> AsyncIterator[TestClient]:
    client = await serve(fake)
    yield client
    await client.close()


async def test_ready_is_health_and_live_stays_200_when_no_worker_serves(
    http: TestClient, fake: FakeClient
) -> None:
    for path in ("/health", "/health/ready", "/health/live"):
        assert (await http.get(path)).status == 200, path
    fake.served = False
    for path in ("/health", "/health/ready"):
        resp = await http.get(path)
        assert resp.status == 503 and (await resp.json())["reason"] == "no worker serves tiny"
    resp = await http.get("/health/live")
    assert resp.status == 200 and (await resp.json())["status"] == "ok"
    fake.brokers[0].alive = False
    assert (await http.get("/health/ready")).status == 503
    assert (await http.get("/health/live")).status == 200


async def test_ready_for_one_model_names_it_by_name_or_alias(
    http: TestClient, fake: FakeClient
) -> None:
    resp = await http.get("/health/ready", params={"model": "org/tiny"})
    assert resp.status == 200 and (await resp.json())["models"] == {"tiny": 1}
    resp = await http.get("/health/ready", params={"model": "other"})
    body = await resp.json()
    assert resp.status == 503 and body["reason"] == "no worker serves other"
    assert body["models"] == {"other": 0}


async def test_live_fails_only_when_a_broker_link_stopped_for_good(
    http: TestClient, fake: FakeClient
) -> None:
    fake.brokers[0].pinging = False
    resp = await http.get("/health/live")
    assert resp.status == 503 and "ipc://fake" in (await resp.json())["reason"]


async def test_health_shows_each_broker_its_queues_and_each_worker(http: TestClient) -> None:
    [broker] = (await (await http.get("/health")).json())["brokers"]
    assert broker["endpoint"] == "ipc://fake" and broker["alive"] is True
    assert broker["last_seen_s"] == 0.5 and broker["failovers"] == 0
    assert broker["queued_tokens"] == {"tiny": 40} and broker["queued_work_s"] == {"tiny": 0.5}
    busy, down = broker["workers"]
    assert (busy["id"], busy["state"], busy["inflight_batches"]) == ("0a", "busy", 2)
    assert busy["tokens_per_s"] == 80.0 and "reason" not in busy
    assert (down["state"], down["reason"]) == ("down", "its connection closed")


async def _samples(http: TestClient) -> dict[tuple[str, frozenset], float]:
    text = await (await http.get("/metrics")).text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _at(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"broker": "ipc://fake", **labels}.items()))]


async def test_metrics_show_lanes_batches_waits_and_workers(http: TestClient) -> None:
    s = await _samples(http)
    tiny = {"model": "tiny"}
    assert _at(s, "embedmesh_broker_lane_queued_tokens", **tiny, lane="interactive") == 8
    assert _at(s, "embedmesh_broker_lane_queued_sequences", **tiny, lane="batch") == 4
    assert _at(s, "embedmesh_broker_lane_tokens_total", **tiny, lane="batch") == 90
    assert _at(s, "embedmesh_broker_lane_sequences_total", **tiny, lane="interactive") == 10
    assert _at(s, "embedmesh_broker_queued_work_seconds", **tiny) == 0.5
    assert _at(s, "embedmesh_broker_drain_rate_tokens_per_second", **tiny) == 80.0
    assert _at(s, "embedmesh_broker_batch_tokens_total", **tiny) == 160
    assert _at(s, "embedmesh_broker_batch_budget_tokens_total", **tiny) == 384
    wait = {**tiny, "lane": "interactive"}
    assert _at(s, "embedmesh_broker_queue_wait_seconds_bucket", **wait, le="0.001") == 2
    assert _at(s, "embedmesh_broker_queue_wait_seconds_bucket", **wait, le="120.0") == 2
    assert _at(s, "embedmesh_broker_queue_wait_seconds_bucket", **wait, le="+Inf") == 3
    assert _at(s, "embedmesh_broker_queue_wait_seconds_sum", **wait) == 130.5
    assert _at(s, "embedmesh_broker_failovers_total") == 0
    assert _at(s, "embedmesh_broker_last_seen_seconds") == 0.5
    busy = {"worker": "host:cpu", "id": "0a", "model": "tiny"}
    assert _at(s, "embedmesh_worker_state", **busy, device="cpu", state="busy") == 1
    assert _at(s, "embedmesh_worker_state", **busy, device="cpu", state="up") == 0
    assert _at(s, "embedmesh_worker_inflight_batches", **busy) == 2
    assert _at(s, "embedmesh_worker_tokens_total", **busy) == 160
    down = {"worker": "host:cpu", "id": "0b", "model": "tiny", "device": "cpu"}
    assert _at(s, "embedmesh_worker_state", **down, state="down") == 1


async def test_a_down_broker_shows_its_link_but_no_queue(http: TestClient, fake: FakeClient):
    fake.brokers[0].alive = False
    fake.brokers[0].failovers = 1
    s = await _samples(http)
    assert _at(s, "embedmesh_broker_up") == 0 and _at(s, "embedmesh_broker_failovers_total") == 1
    assert not any(name.startswith("embedmesh_worker_") for name, _ in s)
    assert not any(name == "embedmesh_broker_lane_queued_tokens" for name, _ in s)

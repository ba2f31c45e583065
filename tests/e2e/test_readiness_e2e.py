"""Readiness vs liveness and the broker's state, through a real ``mesh-launch --role ingress``
in front of a real broker and real workers (their own mesh: the test kills a worker)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Ingress
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh

# The ingress hears of a dead worker at its next catalog after the broker buried it: one ping
# interval after a closed connection, the liveness window after a silent one. The slack is for
# a loaded test machine, not for the mesh.
DETECT_S = TEST_LIVENESS.expiry_s + 4.0


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _status(ingress: Ingress, path: str) -> tuple[int, dict]:
    code, body = _get(f"{ingress.url}{path}")
    return code, json.loads(body)


def _until(check: Callable[[], bool], timeout_s: float, what: str, mesh: Mesh) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout_s:.0f}s\n{mesh.logs()}")


def _samples(ingress: Ingress) -> dict[tuple[str, frozenset], float]:
    code, text = _get(f"{ingress.url}/metrics")
    assert code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path)
    m.start_broker()
    yield m
    m.stop()


@pytest.fixture
def ingress(mesh: Mesh) -> Iterator[Ingress]:
    ing = Ingress(mesh)
    _until(lambda: _status(ing, "/health/live")[0] == 200, 60, "/health/live answered", mesh)
    yield ing
    ing.stop()


def _send_bulk(ingress: Ingress, texts: list[str]) -> None:
    """POST an embeddings request that will not be answered (a hung worker) from a thread."""

    def post() -> None:
        body = json.dumps({"model": MODEL, "input": texts}).encode()
        req = urllib.request.Request(
            f"{ingress.url}/v1/embeddings", body, {"Content-Type": "application/json"}
        )
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=60).read()

    threading.Thread(target=post, daemon=True).start()


def test_readiness_follows_the_workers_and_liveness_the_process(
    mesh: Mesh, ingress: Ingress
) -> None:
    code, body = _status(ingress, "/health/ready")
    assert code == 503 and body["status"] == "unavailable"
    assert _status(ingress, "/health/live")[0] == 200
    assert _status(ingress, "/health")[0] == 503  # /health is readiness, as TEI's

    worker = mesh.start_worker("--credits", "1")
    _until(lambda: _status(ingress, "/health/ready")[0] == 200, 120, "ready with a worker", mesh)
    code, body = _status(ingress, f"/health/ready?model={MODEL}")
    assert code == 200 and body["models"] == {MODEL: 1}
    [broker] = body["brokers"]
    [up] = broker["workers"]
    assert (up["model"], up["device"], up["state"]) == (MODEL, "cpu", "up")

    worker.kill()
    worker.wait()
    _until(lambda: _status(ingress, "/health/ready")[0] == 503, DETECT_S, "not ready", mesh)
    code, body = _status(ingress, "/health/ready")
    assert body["reason"] == f"no worker serves {MODEL}" and body["models"] == {MODEL: 0}
    assert _status(ingress, "/health/live")[0] == 200
    [down] = _status(ingress, "/health")[1]["brokers"][0]["workers"]
    assert (down["id"], down["state"]) == (up["id"], "down") and down["reason"]


def test_metrics_show_per_lane_depth_while_a_hung_worker_keeps_work_queued(
    mesh: Mesh, ingress: Ingress
) -> None:
    mesh.start_worker("--credits", "1", hang_after=0)  # takes one batch, never answers it
    _until(lambda: _status(ingress, "/health/ready")[0] == 200, 120, "ready with a worker", mesh)
    texts = [f"passage {i}: " + "lorem ipsum dolor sit amet " * 16 for i in range(64)]
    _send_bulk(ingress, texts)  # ~6,500 tokens: the batch lane; 2,048 go to the worker

    def queued() -> bool:
        s = _samples(ingress)
        key = ("embedmesh_broker_lane_queued_tokens", _labels(mesh, lane="batch"))
        return s.get(key, 0) > 0

    _until(queued, 30, "batch-lane tokens queued", mesh)
    s = _samples(ingress)
    batch = s[("embedmesh_broker_lane_queued_tokens", _labels(mesh, lane="batch"))]
    assert s[("embedmesh_broker_lane_queued_tokens", _labels(mesh, lane="interactive"))] == 0
    assert batch == s[("embedmesh_broker_queued_tokens", _labels(mesh))]
    sequences = s[("embedmesh_broker_lane_queued_sequences", _labels(mesh, lane="batch"))]
    assert 0 < sequences < len(texts)
    assert s[("embedmesh_broker_batches_total", _labels(mesh))] == 1
    assert s[("embedmesh_broker_batch_budget_tokens_total", _labels(mesh))] == 2048
    assert s[("embedmesh_broker_inflight_batches", frozenset({"broker": mesh.frontend}.items()))]
    [worker] = _status(ingress, "/health")[1]["brokers"][0]["workers"]
    assert (worker["state"], worker["inflight_batches"]) == ("busy", 1)
    busy = {"broker": mesh.frontend, "worker": worker["name"], "id": worker["id"],
            "model": MODEL, "device": "cpu", "state": "busy"}  # fmt: skip
    assert s[("embedmesh_worker_state", frozenset(busy.items()))] == 1


def _labels(mesh: Mesh, **extra: str) -> frozenset:
    return frozenset({"broker": mesh.frontend, "model": MODEL, **extra}.items())

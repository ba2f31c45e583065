"""bench/cluster_run.py against a fleet that others started (external hosts: a stub ingress
that wants an API key and a port standing for the broker): nothing is started there, the run
waits for /health and every worker in /v1/models, loads it from two local load processes with
the key, watches /metrics. Runs on
any machine (no namespaces); tests/integration/test_cluster_bench.py starts a real mesh."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from bench.cluster_run import ClusterRun
from bench.topology import parse
from tests.unit.bench.conftest import Stub

METRICS = """# HELP embedmesh_broker_queued_tokens Tokens waiting in the broker's queue.
# TYPE embedmesh_broker_queued_tokens gauge
embedmesh_broker_queued_tokens{broker="tcp://b:5555",model="all-MiniLM-L6-v2"} 12.0
"""


class Fleet:
    """The ingress of a fleet as the run sees it: ready once ``workers`` are listed."""

    def __init__(self) -> None:
        self.stub = Stub(delay_s=0.01)
        self.workers = 0
        self.models_asked = 0

    async def embeddings(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sesame":
            return web.json_response({"error": {"message": "key"}}, status=401)
        return await self.stub.embeddings(request)

    async def models(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sesame":
            return web.json_response({"error": {"message": "key"}}, status=401)
        self.models_asked += 1
        self.workers = min(2, self.workers + 1)  # the second worker joins a moment later
        return web.json_response({"data": [{"id": "all-MiniLM-L6-v2", "workers": self.workers}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
        app.router.add_get("/metrics", lambda _: web.Response(text=METRICS))
        return app


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "load", [{"concurrency": 2}, {"mode": "open", "rate": 40.0}], ids=["closed", "open"]
)
async def test_an_external_fleet_is_waited_for_loaded_and_watched(tmp_path, load) -> None:  # noqa: ANN001
    fleet = Fleet()
    runner = web.AppRunner(fleet.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    broker = socket.create_server(("127.0.0.1", 0))  # stands for the broker's frontend
    (tmp_path / "key").write_text("sesame\n")
    topo = parse({
        "load": {"texts_per_request": 2, "duration_s": 1.0, "warmup_s": 0.2,
                 "api_key_file": str(tmp_path / "key"), **load},
        "hosts": {
            "fleet": {"kind": "external", "address": "127.0.0.1",
                      "broker": {"front_port": broker.getsockname()[1]},
                      "workers": [{"broker": "fleet", "count": 2}],
                      "ingress": {"brokers": ["fleet"], "port": http_port}},
            "here": {"kind": "local", "load_procs": 2},
        },
    })  # fmt: skip
    try:
        result = await asyncio.to_thread(ClusterRun(topo, tmp_path / "logs", "fleet").run)
    finally:
        broker.close()
        await runner.cleanup()
    stats = result["lanes"]["load"]["stats"]
    assert 0 < stats["requests"] == stats["ok"] < fleet.stub.calls  # the warm-up's uncounted
    assert stats["errors"] == {}
    assert stats["tokens"] == 6 * stats["ok"]  # the stub's 3 tokens a text, 2 texts a request
    if "concurrency" in load:
        assert fleet.stub.peak == 2  # one client in each of the two load processes
    else:  # two Poisson streams of 20/s: about 40 in the second measured
        assert 15 <= stats["requests"] <= 80
    assert fleet.models_asked >= 2  # not loaded before both workers were listed
    assert result["roles"] == [] and result["delay_by"] == "none"  # nothing started there
    (queue,) = result["metrics"]["fleet"]["queue_depth"].values()
    assert queue["max"] == 12.0

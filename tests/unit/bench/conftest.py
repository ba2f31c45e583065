"""A stub ``/v1/embeddings`` on loopback for mesh-bench's load tests: answers like the ingress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from bench.hops import TIMINGS_HEADER
from bench.load import Target


class Stub:
    """One vector per input, 3 tokens each; counts concurrency, records each body's
    ``priority`` and answers ``x-embedmesh-timings`` when asked."""

    def __init__(self, delay_s: float = 0.005, status: int = 200) -> None:
        self.delay_s, self.status = delay_s, status
        self.in_flight = self.peak = self.calls = 0
        self.priorities: list[str | None] = []
        self.timings = "ingress_parse=0.05,ingress_tokenize=0.2,client_mesh=1.5"

    async def embeddings(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.calls += 1
        self.priorities.append(body.get("priority"))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        if self.status != 200:
            return web.json_response({"error": {"message": "no"}}, status=self.status)
        data = [{"index": i, "embedding": [0.0]} for i in range(len(inputs))]
        usage = {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}
        headers = {TIMINGS_HEADER: self.timings} if request.headers.get(TIMINGS_HEADER) else {}
        return web.json_response({"data": data, "usage": usage}, headers=headers)


async def serve(stub: Stub) -> AsyncIterator[Target]:
    app = web.Application()
    app.router.add_post("/v1/embeddings", stub.embeddings)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield Target(f"http://127.0.0.1:{port}/v1", timeout_s=5)
    await runner.cleanup()


@pytest.fixture
async def stub_target() -> AsyncIterator[tuple[Stub, Target]]:
    stub = Stub()
    async for target in serve(stub):
        yield stub, target

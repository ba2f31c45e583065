"""mesh-bench's load generators against a stub /v1/embeddings on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from bench.corpus import request_bodies
from bench.load import Target, closed_loop, open_loop, sequential


class Stub:
    """Answers like the ingress (one vector per input, 3 tokens each); counts concurrency."""

    def __init__(self, delay_s: float = 0.005, status: int = 200) -> None:
        self.delay_s, self.status = delay_s, status
        self.in_flight = self.peak = self.calls = 0

    async def embeddings(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.calls += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        if self.status != 200:
            return web.json_response({"error": {"message": "no"}}, status=self.status)
        data = [{"index": i, "embedding": [0.0]} for i in range(len(inputs))]
        usage = {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}
        return web.json_response({"data": data, "usage": usage})


async def _serve(stub: Stub) -> AsyncIterator[Target]:
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
    async for target in _serve(stub):
        yield stub, target


BODIES = request_bodies([f"text {i}" for i in range(10)], "m", 2)


async def test_closed_loop_sends_exactly_the_count_with_at_most_n_in_flight(stub_target) -> None:
    stub, target = stub_target
    samples, elapsed = await closed_loop(target, BODIES, 4, count=40)
    assert len(samples) == 40 == stub.calls
    assert stub.peak == 4
    assert all(s.ok and s.tokens == 6 and s.texts == 2 for s in samples)
    assert elapsed >= 10 * stub.delay_s


async def test_closed_loop_by_duration_counts_what_completed_inside_the_window(stub_target) -> None:
    _, target = stub_target
    opened: list[float] = []
    samples, elapsed = await closed_loop(
        target, BODIES, 2, duration_s=0.3, warmup_s=0.2, on_window=lambda: opened.append(1)
    )
    assert elapsed == 0.3 and opened == [1]
    assert samples
    first_start = min(s.start_s for s in samples)
    # Warm-up answers are left out; the last answers end before the window closes.
    assert max(s.end_s for s in samples) - first_start < 0.3 + 0.05


async def test_closed_loop_by_count_measures_that_many_after_the_warmup(stub_target) -> None:
    stub, target = stub_target
    samples, elapsed = await closed_loop(target, BODIES, 3, count=12, warmup_s=0.1)
    assert len(samples) == 12 and stub.calls > 12
    assert elapsed > 0


async def test_sequential_never_overlaps_requests(stub_target) -> None:
    stub, target = stub_target
    samples, _ = await sequential(target, BODIES, 10, warmup=3)
    assert len(samples) == 10 and stub.calls == 13 and stub.peak == 1


async def test_open_loop_sends_on_schedule_regardless_of_answers(stub_target) -> None:
    stub, target = stub_target
    stub.delay_s = 0.2  # answers slower than arrivals: requests must overlap
    samples, _ = await open_loop(target, BODIES, 100, count=30, seed=1, warmup_s=0.1)
    assert len(samples) == 30 and stub.peak > 5
    assert stub.calls > 30  # the warm-up arrivals went out too, unmeasured
    assert all(s.ok for s in samples)
    starts = sorted(s.start_s for s in samples)
    assert starts[-1] - starts[0] < 1.0  # ~0.3 s of arrivals at 100/s


async def test_error_statuses_and_refused_connections_are_recorded_not_raised() -> None:
    stub = Stub(status=429)
    async for target in _serve(stub):
        samples, _ = await closed_loop(target, BODIES, 2, count=4)
        assert {s.status for s in samples} == {"429"}
        assert all(s.tokens == 0 for s in samples)
    samples, _ = await closed_loop(target, BODIES, 1, count=1)  # the server is gone now
    assert samples[0].status == "ClientConnectorError"

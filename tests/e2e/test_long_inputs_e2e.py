"""Long inputs cost what they are allowed to cost (#8 item 5), and live work goes first in the
ingress (#8 item 3): through HTTP on a real mesh, with the real ingress app and MeshClient."""

from __future__ import annotations

import asyncio
import resource
import time

import aiohttp
import numpy as np

from tests.e2e.conftest import AUTH, MAX_TOKENS, MODEL, Ingress, Mesh, in_process_ingress

# 2M words, 10 MB of JSON: under the default 16 MB body limit.
HUGE_TEXT = "the quick brown fox jumps over the lazy dog again " * 200_000
# Generous bounds (the issue asks for one): its target is 100 ms on an idle 2-core machine,
# but this one is shared with other test runs and a CPU worker answers the queries, so the
# bounds only catch the old behaviour (16 s of stalled loop, then 503s for everyone).
MAX_QUERY_S = 5.0
# The loop of the in-process ingress must never stall for as long as the tests' liveness
# window (TEST_LIVENESS: 1 s), after which the client would declare the broker lost.
MAX_LOOP_STALL_S = 1.0


async def queries_while(url: str, headers: dict, busy: asyncio.Future) -> list[tuple[int, float]]:
    """One short query after another until ``busy`` is done: (status, seconds) of each."""
    out: list[tuple[int, float]] = []
    async with aiohttp.ClientSession(headers=headers) as http:
        while not busy.done() or len(out) < 3:
            start = time.perf_counter()
            body = {"model": MODEL, "input": "is the mesh still answering?"}
            async with http.post(f"{url}/v1/embeddings", json=body) as resp:
                await resp.read()
                out.append((resp.status, time.perf_counter() - start))
    return out


async def send(url: str, headers: dict, body: dict) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(f"{url}/v1/embeddings", json=body) as resp,
    ):
        return resp.status, await resp.json()


async def loop_stalls(stop: asyncio.Event) -> float:
    """The longest time this event loop went without running a 5 ms ticker, until ``stop``."""
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_a_huge_text_neither_stalls_other_clients_nor_loses_the_broker(
    e2e_mesh: Mesh,
) -> None:
    # In this process, with the tests' short liveness (the broker is declared lost after 1 s of
    # silence): any stall of the shared event loop over that fails in-flight queries with 503.
    async with in_process_ingress(e2e_mesh, auto_truncate=True) as (url, _client):
        await send(url, {}, {"model": MODEL, "input": "warm up"})
        rss_before = max_rss_mb()
        stop = asyncio.Event()
        ticker = asyncio.ensure_future(loop_stalls(stop))
        huge = asyncio.ensure_future(send(url, {}, {"model": MODEL, "input": HUGE_TEXT}))
        timings = await queries_while(url, {}, huge)
        status, doc = await huge
        stop.set()
        stall = await ticker
    assert status == 200, doc
    assert doc["usage"]["prompt_tokens"] == MAX_TOKENS  # cut at the limit, as sent
    statuses = [s for s, _ in timings]
    assert statuses.count(200) == len(statuses), statuses  # no 503: the broker was never lost
    assert stall < MAX_LOOP_STALL_S, stall
    assert max(t for _, t in timings) < MAX_QUERY_S, timings
    # Tokenizing all of it held 4-10 GB; the cut keeps it to the body and its parsed copy.
    assert max_rss_mb() - rss_before < 1000


async def test_a_huge_text_without_truncation_is_refused_at_once_naming_the_limit(
    ingress: Ingress,
) -> None:
    await send(ingress.url, AUTH, {"model": MODEL, "input": "warm up"})
    huge = asyncio.ensure_future(send(ingress.url, AUTH, {"model": MODEL, "input": HUGE_TEXT}))
    timings = await queries_while(ingress.url, AUTH, huge)
    status, doc = await huge
    assert status == 422 and doc["error"]["param"] == "input", doc
    assert f"input[0] has more than {MAX_TOKENS} tokens" in doc["error"]["message"]
    assert all(s == 200 for s, _ in timings), timings
    assert max(t for _, t in timings) < MAX_QUERY_S, timings


async def test_the_client_can_choose_the_lane_by_field_or_header(ingress: Ingress) -> None:
    texts = ["a short query"]
    for extra, headers in [
        ({"priority": "batch"}, AUTH),
        ({}, {**AUTH, "X-Embedmesh-Priority": "batch"}),
        ({"priority": "interactive"}, AUTH),
    ]:
        status, doc = await send(ingress.url, headers, {"model": MODEL, "input": texts, **extra})
        assert status == 200 and len(doc["data"]) == 1, doc
    status, doc = await send(ingress.url, AUTH, {"model": MODEL, "input": texts, "priority": 1})
    assert status == 422 and doc["error"]["param"] == "priority"


async def test_timings_come_back_per_hop_when_asked(ingress: Ingress) -> None:
    body = {"model": MODEL, "input": "where does the time go"}
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{ingress.url}/v1/embeddings", json=body) as resp:
            assert resp.status == 200 and "x-embedmesh-timings" not in resp.headers
        asked = {"X-Embedmesh-Timings": "1"}
        async with http.post(f"{ingress.url}/v1/embeddings", json=body, headers=asked) as resp:
            assert resp.status == 200
            header = resp.headers["x-embedmesh-timings"]
    hops = {k: float(v) for k, v in (part.split("=") for part in header.split(","))}
    for name in ["ingress_parse", "ingress_tokenize", "client_mesh", "ingress_render"]:
        assert 0 <= hops[name] <= hops["ingress_total"], hops
    assert np.isfinite(list(hops.values())).all()

"""Many clients at once, and clients that hang up."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import numpy as np
import openai

from mesh.client import MeshClient
from tests.e2e.conftest import (
    API_KEY,
    AUTH,
    MODEL,
    TEST_LIVENESS,
    Ingress,
    Mesh,
    Reference,
    big_token_request,
    cosines,
    idle,
    queued_sequences,
    wait_until,
)


async def test_200_concurrent_requests_of_mixed_sizes_each_get_their_own_answer(
    reference: Reference, ingress: Ingress, corpus: list[dict]
) -> None:
    rng = random.Random(7)
    queries = [r["text"] for r in corpus if r["kind"] == "query"][:150]
    passages = [r["text"] for r in corpus if r["kind"] == "passage" and len(r["text"]) < 700]
    pool = queries + passages[:12]
    # 1 to 12 inputs, in random order, each a different draw from the pool; few tokens in all
    # (about 15 k) so that it stays quick on 2 cores.
    requests = [rng.sample(pool, rng.choice([1, 1, 1, 1, 2, 2, 3, 4, 6, 12])) for _ in range(200)]
    # Half ask for float, half leave the format to the client (base64, decoded by it).
    formats = [rng.choice([{"encoding_format": "float"}, {}]) for _ in requests]
    want = {t: v for t, v in zip(pool, reference.embed(pool), strict=True)}
    client = openai.AsyncOpenAI(
        base_url=f"{ingress.url}/v1", api_key=API_KEY, max_retries=0, timeout=180
    )
    try:
        responses = await asyncio.gather(
            *(
                client.embeddings.create(model=MODEL, input=texts, **fmt)
                for texts, fmt in zip(requests, formats, strict=True)
            ),
            return_exceptions=True,
        )
    finally:
        await client.close()
    failures = [r for r in responses if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} of 200 failed; first: {failures[0]!r}"
    for texts, response in zip(requests, responses, strict=True):
        got = np.array([d.embedding for d in response.data], dtype=np.float32)
        assert got.shape == (len(texts), 384)
        assert cosines(got, np.stack([want[t] for t in texts])).min() >= 0.9999


async def test_a_client_that_hangs_up_cancels_its_queued_work(
    ingress: Ingress, e2e_mesh: Mesh
) -> None:
    async with MeshClient(e2e_mesh.frontend, liveness=TEST_LIVENESS) as stats:
        await stats.wait_ready(10, MODEL)
        await wait_until(lambda: idle(stats), 30, "the mesh is idle")
        session = aiohttp.ClientSession(headers=AUTH)
        try:
            call = asyncio.create_task(
                session.post(f"{ingress.url}/v1/embeddings", json=big_token_request(800, seed=5))
            )
            await wait_until(lambda: queued_sequences(stats) >= 700, 60, "the request queues")
            call.cancel()  # drops the connection mid-request
        finally:
            await session.close()
        # The broker's queue empties within a heartbeat or two; only batches already on the
        # worker finish (at most its two credits' worth).
        await wait_until(lambda: queued_sequences(stats) == 0, 3, "the CANCEL reaches the broker")
        await wait_until(lambda: idle(stats), 30, "in-flight batches finish")

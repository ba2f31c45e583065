"""The response-bytes bound on a real mesh: a request whose answer would be over the bound is
413 before any work is sent, saying the bound and how many inputs fit, and the ingress stays
healthy; requests under it, at once, are all served."""

from __future__ import annotations

import asyncio

import aiohttp

from mesh.ingress.responses import row_bytes
from tests.e2e.conftest import in_process_ingress, queued_sequences
from tests.integration.conftest import MODEL, Mesh

DIMS = 384  # all-MiniLM-L6-v2
ROW = row_bytes(DIMS, "float32", "float")
BOUND = 20 * ROW  # 20 float rows fit one response
BUDGET = 4 * BOUND


async def _post(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_an_answer_over_the_bound_is_413_and_answers_under_it_are_served(
    e2e_mesh: Mesh,
) -> None:
    settings = {"max_response_bytes": BOUND, "response_budget_bytes": BUDGET}
    ingress = in_process_ingress(e2e_mesh, **settings)
    async with ingress as (base, client), aiohttp.ClientSession() as http:
        texts = [f"text number {i} about rivers and mountains" for i in range(50)]
        status, doc = await _post(http, f"{base}/v1/embeddings", {"input": texts, "model": MODEL})
        assert status == 413, doc
        message = doc["error"]["message"]
        assert f"{BOUND} bytes per response" in message, message
        assert "about 20 of these 50 inputs fit" in message and "base64" in message
        assert queued_sequences(client) == 0  # refused before any work reached the mesh
        # Per-token states of a long text: TEI's shape, the same bound.
        status, doc = await _post(http, f"{base}/embed_all", {"inputs": " ".join(texts[:6])})
        assert status == 413 and doc["error_type"] == "Validation", doc
        assert "per response" in doc["error"]
        # base64 is about a third the size: the same 50 inputs fit.
        b64 = {"input": texts, "model": MODEL, "encoding_format": "base64"}
        status, doc = await _post(http, f"{base}/v1/embeddings", b64)
        assert status == 200 and len(doc["data"]) == 50, doc
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 200
        # Requests under the bound, at once: their reservations add up to the budget.
        small = {"input": texts[:20], "model": MODEL}
        results = await asyncio.gather(
            *(_post(http, f"{base}/v1/embeddings", small) for _ in range(BUDGET // BOUND))
        )
        assert [s for s, _ in results] == [200] * (BUDGET // BOUND), results
        assert all(len(doc["data"]) == 20 for _, doc in results)

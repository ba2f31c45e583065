"""The ordering a batch job relies on, on a real broker and worker: a live query sent while
batch-lane work is queued is dispatched ahead of it. The evidence is the order in which the
requests complete, not how long anything took: with first come first served alone, the query
sent last would complete last."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from mesh.client import MeshClient
from proto_msgs import Lane
from tests.integration.conftest import MODEL, Mesh, wait_for_workers

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus.jsonl"
BULK_REQUESTS = 24
PER_REQUEST = 16


async def test_a_live_query_completes_before_batch_work_queued_ahead_of_it(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker()  # one thread, a 2048-token budget: the batch lane backs up
    with CORPUS.open() as f:
        texts = [json.loads(line)["text"] for line in f][: BULK_REQUESTS * PER_REQUEST]
    async with MeshClient(mesh.frontend) as client:
        await wait_for_workers(client, 1)
        order: list[str] = []

        async def run(name: str, group: list[str], lane: Lane) -> None:
            await client.embed(group, MODEL, lane=lane, timeout_s=240, truncate=True)
            order.append(name)

        bulk = [
            asyncio.create_task(
                run(f"bulk-{i}", texts[i * PER_REQUEST :][:PER_REQUEST], Lane.BATCH)
            )
            for i in range(BULK_REQUESTS)
        ]
        while not order:  # the worker is busy and the rest of the batch lane waits queued
            await asyncio.sleep(0.01)
        queued_before = BULK_REQUESTS - len(order)
        await run("live", ["where does a live query go while a batch runs"], Lane.INTERACTIVE)
        await asyncio.gather(*bulk)
    after = len(order) - 1 - order.index("live")
    # Ahead of most of the batch work that was queued before it (an aged batch-lane head may
    # still take up to half of a batch beside it).
    assert after >= queued_before // 2, (order, queued_before, mesh.logs())

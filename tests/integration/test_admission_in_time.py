"""Admission in time with real processes: a full mesh answers 429 at once, and a client that
sees from the broker's Pong that a request would end past its timeout refuses it before
tokenizing it (issue #9)."""

from __future__ import annotations

import asyncio

from mesh.client import MeshClient
from mesh.errors import DeadlineExceeded, Overloaded
from proto_msgs import Lane
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers
from tests.integration.test_reliability import corpus_texts

TIMEOUT_S = 5.0


async def _flood(client: MeshClient, texts: list[str], stop: asyncio.Event) -> tuple[int, int]:
    """Keep the batch lane full: resubmit on every answer; count (ok, refused)."""
    ok = refused = 0
    while not stop.is_set():
        try:
            await client.embed(texts, MODEL, lane=Lane.BATCH, truncate=True)
            ok += 1
        except Overloaded:
            refused += 1
            await asyncio.sleep(0.05)
        except DeadlineExceeded:
            pass  # the rate is an estimate: admitted work may still end late now and then
    return ok, refused


async def test_a_full_mesh_refuses_in_time_and_the_client_refuses_before_tokenizing(
    mesh: Mesh,
) -> None:
    mesh.start_broker()
    mesh.start_worker()
    texts = corpus_texts(400)
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS, default_timeout_s=TIMEOUT_S) as c:
        await wait_for_workers(c, 1)
        await c.embed(
            texts[:64], MODEL, lane=Lane.BATCH, truncate=True
        )  # teaches the broker the worker's rate
        stop = asyncio.Event()
        flooders = [asyncio.create_task(_flood(c, texts[i::24][:16], stop)) for i in range(24)]
        encodes = 0
        real_encode = c.tokenizers.encode

        async def counting_encode(*args, **kwargs):
            nonlocal encodes
            encodes += 1
            return await real_encode(*args, **kwargs)

        c.tokenizers.encode = counting_encode  # type: ignore[method-assign]
        early = 0
        try:
            for _ in range(100):
                await asyncio.sleep(2 * TEST_LIVENESS.interval_s)
                before = encodes
                try:
                    # About 12k tokens: the floor the client computes from its words is well
                    # past a second of this worker's work.
                    valid = await c.prepare_texts(
                        texts[:200], MODEL, lane=Lane.BATCH, truncate=True
                    )
                except Overloaded as exc:
                    early += 1
                    assert encodes == before, "refused early means never tokenized"
                    assert exc.retry_after_s is not None and exc.retry_after_s >= 1.0
                    if early >= 3:
                        break
                else:
                    assert valid.tokens > 0
        finally:
            stop.set()
            results = await asyncio.gather(*flooders)
        ok = sum(r[0] for r in results)
        refused = sum(r[1] for r in results)
        print(f"flood: {ok} ok, {refused} refused; {early} refused early")
        assert refused > 0, "work that cannot end within its deadline must be refused"
        assert ok > 0
        assert early >= 3, "the client must refuse before tokenizing what would end too late"
        # Once the flood is gone, a query is served again.
        await asyncio.sleep(TIMEOUT_S)
        result = await c.embed(["a query after the flood"], MODEL)
        assert result.embeddings.shape[0] == 1

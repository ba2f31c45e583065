"""Admission in time on a fresh mesh, real processes: the worker's probe rate lets the broker
refuse up front (429) what cannot end within its deadline, before any batch has taught it a
rate; a reasonable request is served."""

from __future__ import annotations

import time

import pytest

from mesh.client import MeshClient
from mesh.errors import DeadlineExceeded, Overloaded
from proto_msgs import Lane
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers
from tests.integration.test_reliability import corpus_texts

TIMEOUT_S = 1.0


async def test_a_fresh_mesh_refuses_up_front_what_cannot_end_in_time_and_serves_the_rest(
    mesh: Mesh,
) -> None:
    mesh.start_broker()
    mesh.start_worker()
    # 2,048 texts, about a hundred thousand tokens: many seconds of one CPU thread's work.
    texts = corpus_texts(64) * 32
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS, default_timeout_s=TIMEOUT_S) as c:
        await wait_for_workers(c, 1)
        started = time.monotonic()
        with pytest.raises(Overloaded) as refused:
            await c.embed(texts, MODEL, lane=Lane.BATCH, truncate=True)
        refused_after = time.monotonic() - started
        assert not isinstance(refused.value, DeadlineExceeded)
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
        assert "send fewer inputs" in str(refused.value), str(refused.value)
        result = await c.embed(corpus_texts(8), MODEL, truncate=True)
        assert result.embeddings.shape == (8, 384)
    print(f"\nrefused after {refused_after:.2f}s (its timeout: {TIMEOUT_S:g}s)")
    logs = mesh.logs(None)
    assert "probe batch" in logs
    print(next(line for line in logs.splitlines() if "probe batch" in line))

"""A CPU worker started with ``--max-batch-tokens auto`` measures its curve, advertises a budget
from the candidates (the broker's catalog carries it), logs the curve and serves."""

from __future__ import annotations

import re

from mesh.client import MeshClient
from mesh.worker.budget import candidates
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers


async def test_a_worker_with_auto_advertises_a_measured_budget_and_serves(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker("--max-batch-tokens", "auto")  # after the fixture's 2048: it wins
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        [model] = [m for m in client.models() if m.name == MODEL]
        assert model.max_batch_tokens in candidates("cpu", model.max_input_tokens)
        log = mesh.logs(tail=None)
        points = re.findall(r"max batch tokens auto: +(\d+) tokens +\d+ tokens/s", log)
        assert len(points) >= 2, log
        chosen = re.search(r"max batch tokens auto: chose (\d+) tokens", log)
        assert chosen is not None and int(chosen.group(1)) == model.max_batch_tokens
        # More tokens than one batch holds: the request spans batches under the budget.
        texts = [f"passage {i} " + "word " * 100 for i in range(40)]
        result = await client.embed(texts, MODEL, timeout_s=120)
        assert result.embeddings.shape == (40, 384)

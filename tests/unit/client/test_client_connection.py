"""Result assembly in the client: chunks by index, duplicates dropped, per-hop timings merged."""

from __future__ import annotations

import asyncio

import numpy as np

from mesh.client.connection import _Pending
from proto_msgs import RequestResult


def chunk(indices: list[int], timings: dict[str, float], tokens: int = 3) -> RequestResult:
    rows = np.array(indices, dtype=np.float32)[:, None] * np.ones((1, 4), dtype=np.float32)
    return RequestResult(
        cid=1, prompt_tokens=tokens, indices=np.array(indices, dtype=np.int32), embeddings=rows,
        queue_ms=1.0, compute_ms=2.0, timings=timings,
    )  # fmt: skip


async def test_timings_are_the_largest_per_hop_over_chunks_plus_the_clients_own() -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=3, tokens=9)
    assert not pending.add(chunk([0, 2], {"worker_compute": 4.0, "broker_in": 0.5}))
    assert pending.add(chunk([1], {"worker_compute": 3.0, "broker_in": 0.7, "broker_out": 0.1}))
    result = pending.result()
    assert result.embeddings[:, 0].tolist() == [0.0, 1.0, 2.0] and result.prompt_tokens == 6
    assert {k: v for k, v in result.timings.items() if k != "client_mesh"} == {
        "worker_compute": 4.0, "broker_in": 0.7, "broker_out": 0.1,
    }  # fmt: skip
    assert result.timings["client_mesh"] >= 0


async def test_a_duplicate_chunk_adds_neither_rows_nor_timings() -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=2, tokens=6)
    pending.add(chunk([0], {"worker_compute": 1.0}))
    pending.add(chunk([0], {"worker_compute": 50.0}))  # a requeued batch answered twice
    assert pending.add(chunk([1], {"worker_compute": 2.0}))
    result = pending.result()
    assert result.timings["worker_compute"] == 2.0 and result.prompt_tokens == 6

"""A WorkerServer around a fake engine, against a ROUTER standing in for the broker: what the
worker's reply tests share."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import zmq

from mesh.config import Liveness
from mesh.worker.engine.runner import EngineBatch, EngineOutputs
from mesh.worker.server import WorkerOptions, WorkerServer
from proto_msgs import (
    BatchAssign,
    Heartbeat,
    ModelInfo,
    OutputOptions,
    WorkerReady,
    decode,
)

DIMS = 8


class SumEngine:
    device = torch.device("cpu")
    has_lexical = False

    def run(self, batch: EngineBatch) -> EngineOutputs:
        # Only a skip the batch has is passed on, so that fakes without prompts take none.
        args = () if batch.skip is None else (batch.skip,)
        return EngineOutputs(self.embed(batch.ids, batch.offsets, *args))

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        sums = np.add.reduceat(ids.astype(np.float32), offsets[:-1])
        return torch.from_numpy(sums)[:, None] * torch.arange(1, DIMS + 1, dtype=torch.float32)


def assign(batch_id: int, tokens: int = 4) -> BatchAssign:
    ids = np.ones(tokens, dtype=np.int32)
    ids[:4] = [1, 2, 3, batch_id]
    return BatchAssign(
        batch_id=batch_id,
        model="m",
        timeout_ms=10_000,
        outputs=[OutputOptions(normalize=False)],
        output_index=np.zeros(2, dtype=np.int32),
        token_ids=ids,
        offsets=np.array([0, 2, tokens], dtype=np.int32),
    )


def next_reply(router: zmq.Socket):
    while True:
        assert router.poll(10_000), "no reply from the worker"
        msg = decode(router.recv_multipart()[1:])
        if not isinstance(msg, Heartbeat):
            return msg


@contextmanager
def serving(
    engine: Any,
    endpoint: str,
    inline_max_ms: float | None = 10.0,
    credits: int = 2,
    liveness: Liveness | None = None,
    **options: Any,
) -> Iterator[tuple[zmq.Socket, bytes, WorkerServer]]:
    """A running WorkerServer around ``engine``, the ROUTER it said READY to, and its
    identity there; stopped (and its thread joined) on exit. ``options``: more
    WorkerOptions fields. ``liveness``: the link's (default: 0.5 s beats, so a worker
    gives up on this ROUTER, which sends none, after 1.5 s)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    info = ModelInfo("m", [], DIMS, 4096, 1000, "mean", False, "0" * 64)
    options = WorkerOptions("w", credits, 4096, 64, "cpu", inline_max_ms=inline_max_ms, **options)
    liveness = liveness or Liveness(interval_s=0.5)
    server = WorkerServer(ctx, engine, info, b"{}", endpoint, options, liveness)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert router.poll(10_000)
        identity, *frames = router.recv_multipart()
        ready = decode(frames)
        assert isinstance(ready, WorkerReady)
        server.ready_sent = ready  # type: ignore[attr-defined]  # for tests of READY itself
        yield router, identity, server
    finally:
        server.stop()
        thread.join(10)
        router.close(linger=0)
        ctx.destroy(linger=0)  # as the worker role does: the link's inproc PULL stays open
    assert not thread.is_alive()

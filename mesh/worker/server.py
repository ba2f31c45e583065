"""A worker process: the compute loop on the main thread, the broker link on its own thread.

The link decodes batches into a queue; this loop runs the engine, post-processes each output
group (Matryoshka prefix, normalization, quantization) and hands encoded results back to the
link over inproc, so (de)serialization overlaps compute.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import zmq

from mesh.config import Liveness
from mesh.worker.engine.outputs import finalize
from mesh.worker.link import BrokerLink, Incoming
from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    ErrorCode,
    ModelInfo,
    WorkerReady,
    encode,
)

log = logging.getLogger("embedmesh.worker")


class EmbeddingEngine(Protocol):
    """What the compute loop needs from an engine (mesh.worker.engine.Engine fits)."""

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor: ...


@dataclass
class WorkerOptions:
    name: str
    credits: int
    max_batch_tokens: int
    max_batch_requests: int
    device: str
    test_hang_after: int | None = None  # test hook: the compute loop hangs after N batches


class WorkerServer:
    def __init__(
        self,
        ctx: zmq.Context,
        engine: EmbeddingEngine,
        model: ModelInfo,
        tokenizer_json: bytes,
        broker_endpoint: str,
        options: WorkerOptions,
        liveness: Liveness,
        connect: Any = None,
    ) -> None:
        self.engine = engine
        self.model = model
        self.options = options
        ready = WorkerReady(
            name=options.name,
            model=model,
            tokenizer_json=tokenizer_json,
            max_batch_tokens=options.max_batch_tokens,
            max_batch_requests=options.max_batch_requests,
            credits=options.credits,
            heartbeat_ms=max(1, int(liveness.interval_s * 1000)),
            device=options.device,
        )
        self.link = BrokerLink(ctx, broker_endpoint, ready, liveness, connect=connect)
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve until stop() (or a signal handler calling it)."""
        self.link.start()
        sender = self.link.result_sender()
        done = 0
        try:
            while not self._stop.is_set():
                try:
                    item = self.link.batches.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item.epoch != self.link.epoch:
                    continue
                if (
                    self.options.test_hang_after is not None
                    and done >= self.options.test_hang_after
                ):
                    log.error("test hook: compute loop hangs now (after %d batches)", done)
                    self._stop.wait()
                    break
                self.link.busy = True
                frames = self._process(item)
                self.link.busy = False
                sender.send_multipart([str(item.epoch).encode(), *frames], copy=False)
                done += 1
                self.link.progress = done
        finally:
            sender.close(linger=0)
            self.link.stop()

    def _process(self, item: Incoming) -> list[Any]:
        batch = item.batch
        expired = time.monotonic() - item.received_at > batch.timeout_ms / 1000
        if expired:
            return encode(
                BatchError(batch.batch_id, ErrorCode.DEADLINE_EXCEEDED, "batch expired", False)
            )
        problem = self._check(batch)
        if problem:
            return encode(BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, problem, False))
        try:
            started = time.perf_counter()
            pooled = self.engine.embed(batch.token_ids, batch.offsets)
            groups = []
            for g, out in enumerate(batch.outputs):
                rows = np.flatnonzero(batch.output_index == g)
                part = pooled if len(batch.outputs) == 1 else pooled[torch.from_numpy(rows)]
                groups.append(finalize(part, out.dims, out.normalize, out.kind))
            ms = (time.perf_counter() - started) * 1000
        except ValueError as exc:  # e.g. dims wider than the model: the input is at fault
            return encode(BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, str(exc), False))
        except Exception as exc:  # engine failure: let another worker try (attempt-capped)
            log.exception("batch %d failed", batch.batch_id)
            return encode(BatchError(batch.batch_id, ErrorCode.INTERNAL, repr(exc), True))
        return encode(BatchResult(batch_id=batch.batch_id, compute_ms=ms, embeddings=groups))

    def _check(self, batch: BatchAssign) -> str | None:
        if batch.model != self.model.name:
            return f"this worker serves {self.model.name!r}, not {batch.model!r}"
        if len(batch.token_ids) and int(batch.token_ids.max()) >= self.model.vocab_size:
            return f"token id out of range (vocabulary size {self.model.vocab_size})"
        longest = int(np.diff(batch.offsets).max())
        if longest > self.model.max_input_tokens:
            return f"sequence of {longest} tokens over the limit {self.model.max_input_tokens}"
        for out in batch.outputs:
            if out.dims is not None and out.dims > self.model.dims:
                return f"dimensions {out.dims} over the model's {self.model.dims}"
        return None

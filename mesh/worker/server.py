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


@dataclass
class _InFlight:
    """A batch between launch and reply: an error decided before compute, or a forward in
    flight (``pooled`` on the host once ``ready`` has fired; None ``ready``: already there)."""

    item: Incoming
    error: BatchError | None = None
    pooled: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None
    started: float = 0.0


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
        self._done = 0  # batches answered

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Serve until stop() (or a signal handler calling it).

        On CUDA the loop is two deep: when the next batch is already queued, its ``embed`` is
        launched before the previous batch's results are finalized and sent, so the GPU runs
        one batch while the host validates, finalizes and serializes the other (results come
        back through pinned memory, copied asynchronously). On CPU, where ``embed`` is
        synchronous, each batch is finished before the next starts, as before.
        """
        self.link.start()
        sender = self.link.result_sender()
        pending: _InFlight | None = None
        try:
            while not self._stop.is_set():
                try:
                    if pending is None:
                        item = self.link.batches.get(timeout=0.1)
                    else:
                        item = self.link.batches.get_nowait()
                except queue.Empty:
                    if pending is not None:
                        self._finish(pending, sender)
                        pending = None
                    continue
                if item.epoch != self.link.epoch:
                    continue
                if (
                    self.options.test_hang_after is not None
                    and self._done >= self.options.test_hang_after
                ):
                    log.error("test hook: compute loop hangs now (after %d batches)", self._done)
                    self._stop.wait()
                    break
                self.link.busy = True
                launched = self._launch(item)
                if pending is not None:
                    self._finish(pending, sender)
                    pending = None
                if launched.ready is None:  # CPU or an early error: nothing to overlap
                    self._finish(launched, sender)
                else:
                    pending = launched
        finally:
            sender.close(linger=0)
            self.link.stop()

    def _launch(self, item: Incoming) -> _InFlight:
        """Check a batch and start its forward; on CUDA this returns before it completes."""
        batch = item.batch
        expired = time.monotonic() - item.received_at > batch.timeout_ms / 1000
        if expired:
            return _InFlight(
                item,
                BatchError(batch.batch_id, ErrorCode.DEADLINE_EXCEEDED, "batch expired", False),
            )
        problem = self._check(batch)
        if problem:
            return _InFlight(
                item, BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, problem, False)
            )
        started = time.perf_counter()
        try:
            pooled = self.engine.embed(batch.token_ids, batch.offsets)
        except ValueError as exc:
            return _InFlight(
                item, BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, str(exc), False)
            )
        except Exception as exc:  # engine failure: let another worker try (attempt-capped)
            log.exception("batch %d failed", batch.batch_id)
            return _InFlight(item, BatchError(batch.batch_id, ErrorCode.INTERNAL, repr(exc), True))
        ready = None
        if pooled.is_cuda:
            host = torch.empty(pooled.shape, dtype=pooled.dtype, pin_memory=True)
            host.copy_(pooled, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            pooled = host
        return _InFlight(item, None, pooled, ready, started)

    def _finish(self, flight: _InFlight, sender: Any) -> None:
        frames = encode(flight.error) if flight.error is not None else self._result(flight)
        self.link.busy = False
        sender.send_multipart([str(flight.item.epoch).encode(), *frames], copy=False)
        self._done += 1
        self.link.progress = self._done

    def _result(self, flight: _InFlight) -> list[Any]:
        batch = flight.item.batch
        try:
            if flight.ready is not None:
                flight.ready.synchronize()
            pooled = flight.pooled
            groups = []
            for g, out in enumerate(batch.outputs):
                rows = np.flatnonzero(batch.output_index == g)
                part = pooled if len(batch.outputs) == 1 else pooled[torch.from_numpy(rows)]
                groups.append(finalize(part, out.dims, out.normalize, out.kind))
            # From launch to results on the host: with the two-deep loop on CUDA this
            # includes waiting behind the previous batch on the device.
            ms = (time.perf_counter() - flight.started) * 1000
        except ValueError as exc:  # e.g. dims wider than the model: the input is at fault
            return encode(BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, str(exc), False))
        except Exception as exc:
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

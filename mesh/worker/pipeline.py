"""Launch a batch now, collect its host results later: what keeps a GPU fed from one worker.

The compute loop calls :meth:`ResultPipeline.launch` for a batch: it validates nothing
(the broker and the wire codec did), runs the engine's forward (``Engine.run``, one call
for every output kind) and each output group's post-processing
(:func:`~mesh.worker.engine.outputs.finalize_tensor`) and, on CUDA, queues the copies of the
results into a pinned host slot followed by an event, then returns without waiting. Another
thread calls :meth:`collect` in launch order: it waits for that batch's event (asleep, the
GIL free), copies the results out of the slot and frees it. So while the
device runs batch *i*, the compute thread already prepares and launches batch *i + 1*, and
batch *i*'s reply (which returns the broker's credit) leaves as soon as its results exist.

At most ``depth`` batches are launched and not yet collected (launch blocks for a free
slot), which bounds device memory and matches the credits the worker advertises. On CPU
there is nothing to overlap: launch computes the results and collect returns them.

Slots are pinned buffers we own and reuse, rather than ``torch.empty(pin_memory=True)`` per
batch, because allocating pinned memory can synchronize the device (measured: the first
two-deep loop did that per batch and ran slower than the serial one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from mesh.worker.engine.heads.spans import absolute_spans
from mesh.worker.engine.outputs import finalize_tensor
from mesh.worker.engine.runner import EngineBatch, EngineEntry, EngineOutputs
from proto_msgs import BatchAssign
from proto_msgs.messages import SPAN_ROWS

_ALIGN = 64  # bytes; every group's results start on this boundary inside a slot


class _Slot:
    """One pinned host buffer; grown (rarely) when a batch's results do not fit."""

    def __init__(self, pinned: bool = True) -> None:
        self.pinned = pinned  # False only in CPU tests: pinning needs CUDA
        self.buf = torch.empty(0, dtype=torch.uint8)

    def views(self, outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        offsets, total = [], 0
        for t in outputs:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        if total > self.buf.numel():
            size = max(1 << 20, 1 << (total - 1).bit_length())
            self.buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        return [
            self.buf[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for o, t in zip(offsets, outputs, strict=True)
        ]


@dataclass
class Launched:
    """A batch whose forward is queued; :meth:`ResultPipeline.collect` gives its results."""

    batch_id: int
    started: float  # perf_counter when its launch began
    host: list[torch.Tensor] | list[np.ndarray]
    done: torch.cuda.Event | None = None
    slot: _Slot | None = None
    keep: list[torch.Tensor] = field(default_factory=list)  # device results until copied
    # perf_counter when the results were on the host: the end of launch on CPU (it computes
    # them), the end of collect's wait and copy out of the slot on CUDA.
    ready_at: float = 0.0
    # Set by ResultPipeline.wait: when the device was done, and the fault it raised if any.
    done_at: float = 0.0
    fault: BaseException | None = None


class ResultPipeline:
    def __init__(self, engine: EngineEntry, device: torch.device, depth: int = 2) -> None:
        self.engine = engine
        self.cuda = device.type == "cuda"
        self._free: list[_Slot] = [_Slot(self.cuda) for _ in range(depth)]
        self._slots = threading.Semaphore(depth)
        self._lock = threading.Lock()
        self._last_done = 0.0
        self.stopping = threading.Event()  # set by the owner to unblock a waiting launch

    def launch(self, batch: BatchAssign) -> Launched:
        """Queue ``batch``'s forward and result copies. Raises ValueError for input the
        engine refuses (a client error) and anything else for an engine failure."""
        started = time.perf_counter()
        with torch.inference_mode():
            result, span_group = self._forward(batch)
            outputs = []
            for g, out in enumerate(batch.outputs):
                source, owner = (result.pooled, batch.output_index)
                if out.kind == "sparse" and result.lexical is not None:  # bge-m3's weights
                    source = result.lexical
                if out.rows in SPAN_ROWS:
                    assert result.span_rows is not None and span_group is not None
                    source, owner = result.span_rows, span_group
                if len(batch.outputs) == 1:
                    part = source
                else:
                    rows = torch.from_numpy(np.flatnonzero(owner == g))
                    if self.cuda:  # pinned and non_blocking: a pageable copy syncs the stream
                        rows = rows.pin_memory().to(source.device, non_blocking=True)
                    part = source[rows]
                if out.rows == "multivector":  # per-token rows through the model's head
                    part = self.engine.project_multivector(part)
                outputs.append(
                    finalize_tensor(
                        part, out.dims, out.normalize, out.kind, out.top_k, out.threshold
                    )
                )
            if not self.cuda:
                host = [t.numpy() for t in outputs]
                return Launched(batch.batch_id, started, host, ready_at=time.perf_counter())
            while not self._slots.acquire(timeout=0.5):
                if self.stopping.is_set():  # a finisher that died or a hung device
                    raise RuntimeError("worker stopping while waiting for a result slot")
            with self._lock:
                slot = self._free.pop()
            try:
                host = slot.views(outputs)
                for dst, src in zip(host, outputs, strict=True):
                    dst.copy_(src, non_blocking=True)
                done = torch.cuda.Event(blocking=True)
                done.record()
            except BaseException:
                self._release(slot)
                raise
        return Launched(batch.batch_id, started, host, done, slot, outputs)

    def _forward(self, batch: BatchAssign) -> tuple[EngineOutputs, np.ndarray | None]:
        """The engine's outputs for ``batch`` (for a batch asking a lexical model, bge-m3,
        for the kind "sparse", its lexical weights too) and, for a batch with spans, each
        span row's output group."""
        skips = [out.pool_skip for out in batch.outputs]
        # Per sequence, the prompt tokens its group's requests leave out of the pooling.
        skip = np.asarray(skips, dtype=np.int64)[batch.output_index] if any(skips) else None
        lexical = self.engine.has_lexical and any(out.kind == "sparse" for out in batch.outputs)
        spans, group = None, None
        if batch.spans is not None and batch.span_offsets is not None:
            spans = absolute_spans(batch.spans, batch.span_offsets, batch.offsets)
            group = np.repeat(batch.output_index, np.diff(batch.span_offsets))
        job = EngineBatch(
            batch.token_ids, batch.offsets, skip, batch.segment_b_start, spans, lexical
        )
        return self.engine.run(job), group

    def wait(self, launched: Launched) -> None:
        """Sleep (without the GIL) until ``launched``'s results exist, for a caller that has
        more to wait for before :meth:`collect` (the finisher: the live gate). The device time
        ends here, not at collect; a device fault is kept for collect to raise, where its
        caller handles it (a CUDA error need not raise twice)."""
        if launched.done is None:
            return
        try:
            launched.done.synchronize()
        except Exception as exc:  # raised at collect
            launched.fault = exc
        launched.done_at = time.perf_counter()

    def collect(self, launched: Launched, spin_s: float = 0.0) -> tuple[list[np.ndarray], float]:
        """Wait for ``launched`` (call in launch order) and return its host results and the
        milliseconds the device spent on it (from when it could start to when it finished).

        ``spin_s``: poll the event for up to this long before sleeping on it. Only for a
        caller no other Python thread is waiting on (the worker's inline path: an idle
        worker's query), where waking from the driver's sleep is pure latency."""
        try:
            if launched.fault is not None:
                raise launched.fault
            if launched.done is not None:
                if spin_s > 0.0:
                    until = time.perf_counter() + spin_s
                    while not launched.done.query() and time.perf_counter() < until:
                        pass
                # A blocking-sync event: this thread sleeps in the driver, without the GIL
                # (torch releases it around the wait), instead of spinning a core or
                # polling, which took the GIL from the compute thread every poll.
                launched.done.synchronize()
                results = [np.array(t.numpy()) for t in launched.host]  # out of the slot
                launched.ready_at = time.perf_counter()
            else:
                results = cast("list[np.ndarray]", list(launched.host))  # CPU: computed
        finally:
            if launched.slot is not None:
                launched.keep.clear()
                self._release(launched.slot)
                launched.slot = None
        now = launched.done_at or time.perf_counter()
        # Batches run one after another on the device: this one started when it was
        # launched or when the previous one finished, whichever was later.
        ms = (now - max(launched.started, self._last_done)) * 1000
        self._last_done = now
        return results, ms

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            self._free.append(slot)
        self._slots.release()

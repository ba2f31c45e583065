"""A worker's live lane: small batches run beside its bulk work instead of behind it.

Without it, a query that reaches a busy GPU worker waits for the bulk batches the worker
holds: behind them in the compute thread's queue, then behind their kernels on the one CUDA
stream, then behind their replies in the finisher. The broker's remedy was to cap the bulk a
worker holds while queries come (``Queue.form_batch``), which kept a query's wait near one
batch but cost bulk its prefetch: on the H200 through HTTP, live p99 13-14 ms with bulk at
0.75 of its solo rate, or bulk at 0.92 with live p99 29 ms (docs/tuning.md).

The live lane gives a small batch a path of its own from end to end: the link thread runs it
when it is quick (``WorkerServer._accept``), else the lane's own thread, one batch at a time
either way, on a sibling engine (:meth:`Engine.live_lane`: its own staging,
attention and cuBLAS workspaces and CUDA graphs, the weights shared), on a CUDA stream of the highest
priority, with a result slot of its own. The GPU's block scheduler then starts the query's
kernels as soon as SMs free up, ahead of the bulk kernels queued on the other stream; graphs
replayed into that stream take its priority. The worker keeps credits for it
(``WorkerReady.live_credits``), and the broker gives bulk only the others and never mixes the
lanes in one batch (``Queue.form_lane_batch``), so bulk keeps every credit it had.

On CPU there are no streams, and two batches at once only share the same cores, so the lane
is a CUDA feature (``mesh-launch --live-lane auto``); it runs on CPU too when asked, which is
what the CPU tests exercise.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import torch

from mesh.worker.engine.runner import EngineEntry
from mesh.worker.pipeline import ResultPipeline


class LiveLane:
    """The sibling engine, its stream and its result slot. Used from one thread at a time
    (the worker's link thread or the lane's own, under the worker's lane lock)."""

    def __init__(self, engine: EngineEntry, max_tokens: int) -> None:
        self.max_tokens = max_tokens  # the largest batch it runs
        self.engine = engine.live_lane(max_tokens)
        device = torch.device(self.engine.device)
        self.cuda = device.type == "cuda"
        # The highest priority the device has (torch maps out-of-range values to it).
        self.stream = torch.cuda.Stream(device, priority=-100) if self.cuda else None
        self.pipeline = ResultPipeline(self.engine, device, depth=1)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Make this lane's stream current for the calling thread (nothing on CPU)."""
        if self.stream is None:
            yield
            return
        with torch.cuda.device(self.stream.device), torch.cuda.stream(self.stream):
            yield

    def warmup(self) -> float:
        """Capture the graph of every bucket up to ``max_tokens``, then time one query-sized
        batch end to end (ms): what the worker's bound on link-thread work
        (``WorkerServer._quick``) starts from."""
        from mesh.worker.engine.gpu import bucket_sizes  # the runner's own buckets

        with self.running():
            self.engine.warmup(bucket_sizes(self.max_tokens))
            ids = np.full(16, min(100, self.engine.vocab_size - 1), dtype=np.int32)
            offsets = np.array([0, 16], dtype=np.int32)
            for _ in range(2):  # the first run pays one-time start-up (on CPU too): not timed
                started = time.perf_counter()
                with torch.inference_mode():
                    self.engine.embed(ids, offsets)
                    if self.stream is not None:
                        self.stream.synchronize()
        return (time.perf_counter() - started) * 1000

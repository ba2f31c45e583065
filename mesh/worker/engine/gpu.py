"""The CUDA forward: pinned host staging, FlashInfer attention, CUDA graphs per token bucket.

A batch of ``T`` tokens falls in the smallest bucket of at least ``T`` rows (16, 32, ... 256,
then four buckets an octave, so padding stays under 25 %) up to ``graph_max_tokens``. A bucket
runs eagerly until its graph exists; after an eager batch its graph is captured if the capture
budget of the current window allows, so start-up stays fast and capture cost spreads over the
first minutes of traffic (``warmup`` captures chosen buckets up front). Graphs go up to the
16k-token batches too: measured on the H200 (docs/performance.md), replaying them instead of launching
eagerly took BERT-base from 1.75 to 1.99 M tok/s and MiniLM from 6.05 to 6.5 M, because this
host's slow cores could not launch ~100 kernels a batch ahead of the GPU.

Inputs go through pinned host buffers (three, used in turn) and ``non_blocking`` copies, so the host prepares the
next batch while the device still runs this one; each graph reads static device buffers
(ids, positions, pooling indices) and ends with the pooling itself (:func:`static_pool`), so
a replayed batch costs the host one launch for what eager pooling takes a dozen for; its
static output is copied before any later replay.

A batch holding spans (contextualized chunks, per-token vectors) replays a second family of
graphs, one per bucket too, captured lazily under the same budget: the same forward and pooling,
then the span means (:func:`.spans.static_span_means`) into ``[rows + 1, H]`` fp32 slots, the
token-to-slot map and inverse lengths staged like the pooling indices. Only a batch that needs
the hidden states themselves (bge-m3's lexical weights) runs eagerly whatever its size.

A model whose attention needs a mask (MPNet's relative bias, ModernBERT's and Gemma 3's
sliding windows: ``needs_masks``) runs its batches that need one eagerly; for a windowed
model that is only a batch holding a sequence longer than ``mask_free_length``
(:func:`.attention.mask_free`), and every other batch takes the path above, window dropped.
Such a batch runs FlashInfer with the window as a mask
(:class:`.flashinfer_windowed.FlashInferWindowed`) where that applies (one window size,
head_dim 64, 128 or 256, no ``keys``; ``EMBEDMESH_WINDOW_MASK=sdpa`` turns it off), else torch
SDPA over length-sorted padded groups (:class:`.attention_grouped.SdpaGrouped`), as MPNet's.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from mesh.config import MAX_BATCH_TOKENS_GPU
from mesh.worker.engine.card import ModelCard
from mesh.worker.engine.heads.pooling import PoolBuffers, fill_pool_indices, static_pool
from mesh.worker.engine.heads.spans import SpanBuffers, fill_span_index, static_span_means
from mesh.worker.engine.kernels.attention import AttentionBackend, mask_free
from mesh.worker.engine.kernels.attention_grouped import SdpaGrouped
from mesh.worker.engine.kernels.flashinfer_attention import (
    WORKSPACE_BYTES,
    FlashInferRagged,
    TorchVarlen,
    cuda_backend,
)
from mesh.worker.engine.kernels.flashinfer_windowed import windowed_backend
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.runner import (
    DeviceBatch,
    OutputHeads,
    RunnerInput,
    RunnerOutput,
    eager_forward,
)

log = logging.getLogger("embedmesh.worker.gpu")

# Most sequences a graph bucket holds; a batch with more runs eagerly. 1024 covers a full
# 8k-token bucket of 8-token queries.
MAX_GRAPH_SEQUENCES = 1024
# Capture budget: seconds of capture per window, so lazy capture never stalls serving long.
CAPTURE_BUDGET_S = 1.0  # 0.5..5 is reasonable; one capture costs 0.02-0.2 s on the H200
CAPTURE_WINDOW_S = 10.0


def bucket_sizes(graph_max_tokens: int) -> list[int]:
    """Token buckets: powers of two to 256, then 4 an octave (x1, 1.25, 1.5, 1.75)."""
    sizes = [16, 32, 64, 128]
    p = 256
    while p <= graph_max_tokens:
        sizes += [p * q // 4 for q in (4, 5, 6, 7)]
        p *= 2
    return [s for s in sizes if s <= graph_max_tokens]


class _Staging:
    """Pinned host buffers for one batch's ids and positions (and a graph's pooling
    indices), reused once the copies out of them have run (an event guards the reuse)."""

    def __init__(self, tokens: int, pooling: str) -> None:
        self._grow(tokens)
        # Sized for the largest graph; only graph batches (never larger) read them.
        self.pool = PoolBuffers.empty(pooling, tokens, MAX_GRAPH_SEQUENCES, pin_memory=True)
        self.spans = SpanBuffers.empty(tokens, pin_memory=True)
        self.copied = torch.cuda.Event()
        self.copied.record()

    def _grow(self, tokens: int) -> None:
        self.ids = torch.empty(tokens, dtype=torch.int64, pin_memory=True)
        self.pos = torch.empty(tokens, dtype=torch.int64, pin_memory=True)
        self.cu = torch.empty(tokens + 1, dtype=torch.int32, pin_memory=True)

    def fill(
        self, ids: np.ndarray, pos: np.ndarray, offsets: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.copied.synchronize()
        if ids.shape[0] > self.ids.shape[0] or offsets.shape[0] > self.cu.shape[0]:
            self._grow(max(ids.shape[0], offsets.shape[0]))
        n, m = ids.shape[0], offsets.shape[0]
        self.ids.numpy()[:n] = ids
        self.pos.numpy()[:n] = pos
        self.cu.numpy()[:m] = offsets
        return self.ids[:n], self.pos[:n], self.cu[:m]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    attn: FlashInferRagged | TorchVarlen
    ids: torch.Tensor
    pos: torch.Tensor
    pool_in: PoolBuffers  # what static_pool reads besides the hidden states
    slots: int
    pooled: torch.Tensor  # [slots, dims] float32 (after any Dense), written by every replay
    # The span family's (None in plain graphs): its slot map and inverse lengths, and the span
    # rows, float32 [rows + 1, hidden], written by every replay.
    span_in: SpanBuffers | None = None
    span_rows: torch.Tensor | None = None


class GpuRunner:
    """Runs a loaded model's packed forward on CUDA; see the module docstring."""

    def __init__(
        self,
        model: PackedEncoder,
        card: ModelCard,
        device: torch.device,
        graph_max_tokens: int = MAX_BATCH_TOKENS_GPU,  # engine.GRAPH_MAX_TOKENS
        graphs: bool = True,
        output_heads: OutputHeads | None = None,
    ) -> None:
        self.model = model
        self.card = card
        # Pooling then any sentence-transformers Dense layers (fp32); no SPLADE head here.
        self.output_heads = output_heads or OutputHeads(card.pooling)
        self.device = device
        # Streams, events and pinned buffers below belong to the current device.
        if device.index is not None:
            torch.cuda.set_device(device)
        self.dtype = model.dtype
        self.heads = model.heads
        # A batch whose attention needs a bias or a window (MPNet's always; ModernBERT's and
        # Gemma 3's with a sequence over mask_free_length) runs eagerly: its masks are planned
        # from lengths read on the host. MPNet's bias only grouped SDPA takes (SDPA per
        # sequence ran 15-30x slower than sentence-transformers: attention_grouped.py); a
        # window FlashInfer takes as a custom mask (flashinfer_windowed.py). A windowed
        # model's other batches take the fast backend and graphs, as BERT's: all on grouped
        # SDPA, ModernBERT-base and EmbeddingGemma-300m ran 0.08 and 0.03 M tok/s on the
        # H200, BERT-base 2.4 M.
        self.masked = model.needs_masks
        self.mask_free_length = model.mask_free_length
        fast = mask_free(1, self.masked, self.mask_free_length)  # False: every batch is masked
        self.graphs_on = graphs and fast
        self.buckets = bucket_sizes(graph_max_tokens) if self.graphs_on else []
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.max_len = card.max_input_tokens
        # eager_attn: the mask-free backend where the model has one, else SDPA's (MPNet);
        # masked_attn: SDPA's, for the batches that need masks (None when none do);
        # windowed_attn: FlashInfer with the window as a mask, for a windowed model's batches
        # that need one, where it applies (None: masked_attn runs them).
        self.masked_attn: SdpaGrouped | None = SdpaGrouped() if self.masked else None
        self.windowed_attn = (
            windowed_backend(model, self.heads, self.dtype, device, self.workspace)
            if self.masked
            else None
        )
        self.eager_attn: AttentionBackend = (
            self._fast_backend() if fast or self.masked_attn is None else self.masked_attn
        )
        self.graphs: dict[int, _Graph] = {}
        self.failed: set[int] = set()  # buckets whose capture failed: they stay eager
        self.span_graphs: dict[int, _Graph] = {}  # the same, for batches holding spans
        self.span_failed: set[int] = set()
        self.pool = torch.cuda.graph_pool_handle()
        # A capture stream of this runner's own. torch's cuBLAS workspace is keyed by (thread's
        # handle, stream), and a graph keeps the workspace it was captured with: on
        # torch.cuda.graph's one default capture stream, a live lane's graphs and the bulk
        # engine's (both captured on the main thread at start) would share one workspace while
        # they replay at once on two streams. EMBEDMESH_SHARED_CAPTURE_STREAM=1 restores the
        # shared stream: a diagnostic for the lane's stall with FlashInfer (CHANGELOG.md).
        shared = os.environ.get("EMBEDMESH_SHARED_CAPTURE_STREAM", "").strip() == "1"
        self.capture_stream: torch.cuda.Stream | None = (
            None if shared else torch.cuda.Stream(device)
        )
        self.lazy_capture = True  # False: only warmup captures (a live lane's runner)
        # One more than the worker's usual two batches in flight, so a third credit does not
        # wait here for a buffer the device has not read yet.
        self.staging = [_Staging(graph_max_tokens, card.pooling) for _ in range(3)]
        self._turn = 0
        self._window_start = time.monotonic()
        self._captured_s = 0.0
        self.capture_seconds = 0.0  # total, for logs and tests
        self.graph_batches = 0  # batches replayed through a graph / run eagerly, for logs
        self.eager_batches = 0
        self.masked_batches = 0  # of the eager ones, those run with masks
        self.windowed_batches = 0  # of the masked ones, those on windowed_attn (the rest SDPA)

    def _fast_backend(
        self, capacity: tuple[int, int] | None = None
    ) -> FlashInferRagged | TorchVarlen:
        """FlashInfer or varlen (``cuda_backend``), eager or for a graph of ``capacity``. For a
        windowed model it is ``windows_covered``: ``forward`` plans it only with batches that
        :func:`mask_free` clears, and a graph is replayed only for those too."""
        backend = cuda_backend(
            self.heads,
            self.dtype,
            self.device,
            self.max_len,
            capacity=capacity,
            workspace=self.workspace,
        )
        backend.windows_covered = self.masked
        return backend

    def bucket_for(self, tokens: int, sequences: int) -> int | None:
        for b in self.buckets:
            if tokens <= b:
                return b if sequences <= min(b, MAX_GRAPH_SEQUENCES) else None
        return None

    def forward(self, batch: RunnerInput) -> RunnerOutput:
        """Pooled rows (and, as asked, the hidden states or span rows) of a validated packed
        batch. A batch replays its bucket's graph once it exists (with spans, the span graph,
        when the spans are in order and disjoint, as the wire's are) unless it needs the
        hidden states whole (a graph's are an intermediate in its private pool, overwritten
        by the next replay) or ``keys`` (planned on the eager backend only). A
        cross-encoder's pairs come as shifted ids: they replay the graphs as texts do."""
        offsets = np.ascontiguousarray(batch.offsets, dtype=np.int32)
        lengths = np.diff(offsets)
        n, total = len(lengths), int(offsets[-1])
        seg = np.repeat(np.arange(n, dtype=np.int64), lengths)
        pos = np.arange(total, dtype=np.int64) - offsets[:-1].astype(np.int64)[seg]
        stage = self.staging[self._turn]
        self._turn = (self._turn + 1) % len(self.staging)
        ids_h, pos_h, cu_h = stage.fill(batch.ids, pos, offsets)
        fast = mask_free(int(lengths.max(initial=0)), self.masked, self.mask_free_length)
        # A masked batch neither replays a graph nor has one captured for its bucket.
        bucket = self.bucket_for(total, n) if fast else None
        spans, keys = batch.spans, batch.keys
        family = self.graphs if spans is None else self.span_graphs
        eager_only = batch.keep_hidden or keys is not None
        graph = family.get(bucket) if bucket is not None and not eager_only else None
        if graph is not None and (spans is None or self._stage_spans(stage, graph, spans)):
            self.graph_batches += 1
            graph.ids[:total].copy_(ids_h, non_blocking=True)
            graph.pos[:total].copy_(pos_h, non_blocking=True)
            self._stage_pooling(stage, graph, seg, offsets, lengths, batch.skip)
            graph.attn.plan(cu_h, self.card.causal)
            stage.copied.record()  # after plan: it may copy from cu_h too
            graph.graph.replay()
            # Copies: the next replay rewrites the static outputs.
            pooled = graph.pooled[:n].clone()
            if spans is None:
                return RunnerOutput(pooled)
            assert graph.span_rows is not None  # a graph of the span family
            return RunnerOutput(pooled, None, graph.span_rows[: spans.shape[0]].clone())
        self.eager_batches += 1
        # keys (a ColBERT query's expansion): the windowed backend only if it takes them.
        windowed = (
            not fast
            and self.windowed_attn is not None
            and (keys is None or self.windowed_attn.takes_keys)
        )
        attn = self.eager_attn if fast else self.windowed_attn if windowed else self.masked_attn
        assert attn is not None  # a masked batch: the model needs masks, so it has masked_attn
        self.masked_batches += not fast
        self.windowed_batches += windowed
        on_device = DeviceBatch(
            ids_h.to(self.device, non_blocking=True),
            pos_h.to(self.device, non_blocking=True),
            cu_h.to(self.device, non_blocking=True),
            cu_h,
        )
        out = eager_forward(
            self.model,
            attn,
            self.output_heads,
            self.card.causal,
            on_device,
            batch,
            stage.copied.record,
        )
        lazy = self.lazy_capture and keys is None
        if bucket is not None and bucket not in family and lazy and self._budget_left():
            self._try_capture(bucket, spans=spans is not None)
        return out

    def _stage_pooling(
        self,
        stage: _Staging,
        graph: _Graph,
        seg: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        skip: np.ndarray | None,
    ) -> None:
        """Hand a graph's pooling its indices for this batch (see :func:`static_pool`)."""
        spec, rows, slots = self.card.pooling, graph.ids.shape[0], graph.slots
        host = stage.pool.head(spec, rows, slots)  # sized to this graph: its spare slot is last
        fill_pool_indices(spec, seg, offsets, lengths, host, rows, slots, skip)
        graph.pool_in.copy_(host)

    def _stage_spans(self, stage: _Staging, graph: _Graph, spans: np.ndarray) -> bool:
        """Hand a span graph its slot map for this batch; False (nothing copied) for spans
        that cannot share one (:func:`.spans.fill_span_index`): the batch then runs eagerly."""
        assert graph.span_in is not None
        host = stage.spans.head(graph.ids.shape[0])
        if not fill_span_index(spans, host.slot.numpy(), host.scale.numpy()):
            return False
        graph.span_in.copy_(host)
        return True

    def warmup(self, buckets: list[int], spans: bool = False) -> None:
        """Capture the given buckets now (each rounded up to a bucket), budget or not; with
        ``spans``, their span graphs too."""
        for tokens in buckets:
            bucket = self.bucket_for(tokens, 1)
            if bucket is None:
                continue
            if bucket not in self.graphs:
                self._try_capture(bucket)
            if spans and bucket not in self.span_graphs:
                self._try_capture(bucket, spans=True)
        # Asked-for captures do not spend the lazy budget: the first one also pays one-time
        # JIT and library start-up (4 s for MiniLM on the H200), which would otherwise keep
        # every later bucket eager for the rest of the window (seen: a whole benchmark run).
        self._window_start, self._captured_s = time.monotonic(), 0.0

    def _budget_left(self) -> bool:
        now = time.monotonic()
        if now - self._window_start > CAPTURE_WINDOW_S:
            self._window_start, self._captured_s = now, 0.0
        return self._captured_s < CAPTURE_BUDGET_S

    def _try_capture(self, rows: int, spans: bool = False) -> None:
        failed = self.span_failed if spans else self.failed
        if rows in failed:
            return
        try:
            self.capture(rows, spans=spans)
        except Exception:  # a graph is an optimisation: serve eagerly rather than fail
            kind = "span graph" if spans else "graph"
            log.exception("capture of the %d-token bucket's %s failed; it stays eager", rows, kind)
            failed.add(rows)
            torch.cuda.synchronize(self.device)

    def capture(self, rows: int, spans: bool = False) -> None:
        """Capture the forward of a ``rows``-token bucket into a CUDA graph; with ``spans``,
        the graph of the span family (it also writes span rows)."""
        started = time.perf_counter()
        seqs = min(rows, MAX_GRAPH_SEQUENCES)
        # Planned below with one sequence of every row, longer than a window may be: the
        # captured kernels do not depend on the lengths (replays re-plan), and forward replays
        # the graph only for batches mask_free clears.
        attn = self._fast_backend(capacity=(seqs, rows))
        ids = torch.zeros(rows, dtype=torch.int64, device=self.device)
        pos = torch.arange(rows, dtype=torch.int64, device=self.device) % 8
        pool_in = PoolBuffers.empty(self.card.pooling, rows, seqs, device=self.device)
        # Zeros: every row into slot 0, a valid map; replays stage their own.
        span_in = SpanBuffers.empty(rows, device=self.device) if spans else None
        # One planned length mix; replays re-plan with their own (same sequence slots).
        attn.plan(torch.tensor([0, rows], dtype=torch.int32), self.card.causal)
        # The warm run on the capture stream itself: a fresh torch.cuda.Stream per capture would
        # draw from torch's pool of 32, and a lazy capture's draw would in time come round to
        # the live lane's capture stream, sharing its graphs' cuBLAS workspace for the warm
        # run's GEMMs while lane graphs replay (the shared stream's deadlock, CHANGELOG.md).
        side = self.capture_stream or torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(side):
            # A warm run first: lazy initialisation (cuBLAS handles, compiled kernels) must
            # not happen inside the capture.
            self._head(self.model(ids, pos, attn), pool_in, seqs, span_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the worker's finisher thread waits on result events meanwhile, which
        # the default ("global") mode forbids during a capture in any thread.
        with (
            torch.inference_mode(),
            torch.cuda.graph(
                graph,
                pool=self.pool,
                stream=self.capture_stream,
                capture_error_mode="thread_local",
            ),
        ):
            pooled, span_rows = self._head(self.model(ids, pos, attn), pool_in, seqs, span_in)
        family = self.span_graphs if spans else self.graphs
        family[rows] = _Graph(graph, attn, ids, pos, pool_in, seqs, pooled, span_in, span_rows)
        spent = time.perf_counter() - started
        self._captured_s += spent
        self.capture_seconds += spent
        kind = "span graph" if spans else "graph"
        log.info("captured the %d-token bucket's %s in %.3f s", rows, kind, spent)

    def _head(
        self, hidden: torch.Tensor, pool_in: PoolBuffers, slots: int, span_in: SpanBuffers | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a graph ends with: the pooling, then any Dense layers, all captured (unused
        slots carry garbage through the Dense layers: only the first n rows are read); and in
        the span family, the span rows."""
        pooled = static_pool(hidden, pool_in, self.card.pooling, slots)
        dense = self.output_heads.dense
        pooled = pooled if dense is None else dense(pooled)
        return pooled, None if span_in is None else static_span_means(hidden, span_in)

    def summary(self) -> str:
        """Graph use so far, for the worker's loop log."""
        return (
            f"graphs {sorted(self.graphs)} (failed {sorted(self.failed)}), span graphs "
            f"{sorted(self.span_graphs)} (failed {sorted(self.span_failed)}), batches "
            f"{self.graph_batches} replayed / {self.eager_batches} eager "
            f"({self.masked_batches} masked, {self.windowed_batches} of them FlashInfer), "
            f"capture {self.capture_seconds:.2f} s"
        )

"""What the engine's entry and its runners share: the batch in, the outputs out, the heads
and the one eager forward (plan -> model -> heads).

``Engine.run`` takes an :class:`EngineBatch` (what a wire batch carries, already validated by
the broker) and returns :class:`EngineOutputs`. In between it hands a runner a
:class:`RunnerInput` (ids with any pair shift applied, the checked skip, the keys of a
ColBERT query's expansion); a runner supplies only what differs by device:

- :class:`mesh.worker.engine.cpu.CpuRunner`: tensors made from the arrays, then
  :func:`eager_forward` (also CUDA's runner for models run eagerly: SPLADE);
- :class:`mesh.worker.engine.gpu.GpuRunner`: pinned staging, CUDA graphs per token bucket
  and the choice of attention backend per batch, :func:`eager_forward` for batches no graph
  replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from mesh.worker.engine.heads.pooling import pool
from mesh.worker.engine.heads.spans import span_means
from mesh.worker.engine.heads.sparse import SparseHead
from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.models.base import PackedEncoder


@dataclass(frozen=True)
class EngineBatch:
    """One packed batch for :meth:`Engine.run`.

    ``ids``: int ``[total]``, ``offsets``: int ``[n + 1]`` from 0 to ``total``, every
    sequence non-empty, ids inside the vocabulary and no sequence over the card's
    ``max_input_tokens`` (the broker checked all of it). ``skip``: int ``[n]`` leading tokens
    of each sequence left out of the pooling (a prompt the model's Pooling excludes).
    ``pairs``: int ``[n]``, for a cross-encoder, where each sequence's second text begins
    (0: a single text). ``spans``: int ``[S, 2]`` packed positions whose final hidden states
    are averaged into span rows (contextualized chunks, per-token vectors). ``lexical``:
    bge-m3's lexical weights too."""

    ids: np.ndarray
    offsets: np.ndarray
    skip: np.ndarray | None = None
    pairs: np.ndarray | None = None
    spans: np.ndarray | None = None
    lexical: bool = False


def checked_skip(skip: np.ndarray | None, lengths: np.ndarray) -> np.ndarray | None:
    """A batch's ``skip`` as int64, or None where it skips nothing; ValueError unless it is
    integers ``[n]`` leaving at least one token of each sequence."""
    if skip is None:
        return None
    skip = np.asarray(skip)
    if skip.shape != lengths.shape or not np.issubdtype(skip.dtype, np.integer):
        raise ValueError("skip must be integers [n], one per sequence")
    if skip.size and (skip.min() < 0 or (skip >= lengths).any()):
        raise ValueError("skip must leave at least one token of each sequence")
    return skip.astype(np.int64) if skip.any() else None


def pair_types(pairs: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """int64 ``[total]`` token types of a batch holding pairs (``pairs``: where each second
    text begins, 0 for none); None when it holds none. ValueError for a split outside its
    sequence."""
    pairs = np.asarray(pairs)
    if pairs.shape != lengths.shape or not np.issubdtype(pairs.dtype, np.integer):
        raise ValueError("pairs must be integers [n], one per sequence")
    if pairs.size and (pairs.min() < 0 or (pairs >= lengths).any()):
        raise ValueError("a pair's second text must begin inside its sequence")
    if not pairs.any():
        return None
    # +1 where a second text begins, -1 where its sequence ends: the running sum is the type.
    step = np.zeros(int(offsets[-1]) + 1, dtype=np.int64)
    split = np.flatnonzero(pairs)
    np.add.at(step, offsets[split].astype(np.int64) + pairs[split], 1)
    np.add.at(step, offsets[split + 1].astype(np.int64), -1)
    return np.cumsum(step[:-1])


def check_spans(spans: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
    """Spans as :meth:`Engine.run` takes them: int ``[S, 2]``, each non-empty and inside one
    sequence (ValueError otherwise)."""
    spans = np.asarray(spans)
    if spans.ndim != 2 or spans.shape[1] != 2 or not np.issubdtype(spans.dtype, np.integer):
        raise ValueError("spans must be integers [S, 2]")
    if spans.size:
        seq = np.searchsorted(offsets, spans[:, 0], side="right") - 1
        ends = np.asarray(offsets)[np.clip(seq + 1, 0, len(lengths))]
        if (
            (spans[:, 0] < 0).any()
            or (spans[:, 1] <= spans[:, 0]).any()
            or (spans[:, 1] > ends).any()
        ):
            raise ValueError("a span must be non-empty and inside one sequence")


@dataclass(frozen=True)
class EngineOutputs:
    """What one forward gives, on the engine's device.

    ``pooled``: ``float32 [n, D]`` per sequence, the model's own output kind: a pooled
    vector (through any Dense layers) of an embedder, a cross-encoder's scores (its
    classifier as Dense), a SPLADE model's vocabulary weights; not normalized.
    ``span_rows``: ``float32 [S, H]`` means of final hidden states, when the batch had spans.
    ``lexical``: ``float32 [n, vocab]`` bge-m3 lexical weights, when asked."""

    pooled: torch.Tensor
    span_rows: torch.Tensor | None = None
    lexical: torch.Tensor | None = None


@dataclass(frozen=True)
class RunnerInput:
    """A batch as a runner takes it: ``ids`` with any pair shift applied, ``skip`` int64 or
    None (none to skip), ``keys`` int ``[n]`` key counts of a ColBERT query's expansion or
    None, ``keep_hidden``: give the final hidden states back (lexical weights)."""

    ids: np.ndarray
    offsets: np.ndarray
    skip: np.ndarray | None = None
    spans: np.ndarray | None = None
    keys: np.ndarray | None = None
    keep_hidden: bool = False


@dataclass(frozen=True)
class RunnerOutput:
    pooled: torch.Tensor
    hidden: torch.Tensor | None = None  # [T, H] when keep_hidden
    span_rows: torch.Tensor | None = None  # [S, H] float32 when spans


class Runner(Protocol):
    """A device's way to run the forward of a non-empty validated batch."""

    def forward(self, batch: RunnerInput) -> RunnerOutput: ...


class EngineEntry(Protocol):
    """What the worker's pipeline asks of an engine (:class:`mesh.worker.engine.engine.Engine`,
    or a stand-in that only embeds)."""

    device: torch.device

    @property
    def has_lexical(self) -> bool:
        """Whether ``run(lexical=True)`` gives bge-m3's lexical weights."""
        ...

    def run(self, batch: EngineBatch) -> EngineOutputs: ...

    def project_multivector(self, rows: torch.Tensor) -> torch.Tensor: ...

    def live_lane(self, max_tokens: int) -> EngineEntry: ...

    # What the live lane's warm-up uses: its graphs, then one query-sized batch timed.
    @property
    def vocab_size(self) -> int: ...

    def warmup(self, buckets: list[int], spans: bool = False) -> None: ...

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor: ...


@dataclass
class OutputHeads:
    """What leaves the model, after the final hidden states: the pooling (or a SPLADE head
    in its place), then any Dense layers (a cross-encoder's classifier among them)."""

    pooling: str
    dense: torch.nn.Module | None = None
    sparse: SparseHead | None = None

    def __call__(
        self,
        hidden: torch.Tensor,
        cu: torch.Tensor,
        skip: torch.Tensor | None,
        spans: np.ndarray | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pooled rows (``float32 [n, D]``) and the span rows when ``spans`` are given."""
        if self.sparse is not None:  # SPLADE weights [n, vocab]: no pooling, no Dense
            pooled = self.sparse(hidden, cu)
        else:
            pooled = pool(hidden, cu, self.pooling, skip)
            if self.dense is not None:
                pooled = self.dense(pooled)
        return pooled, None if spans is None else span_means(hidden, spans)


@dataclass(frozen=True)
class DeviceBatch:
    """A batch's ids, positions and offsets on the device, and its offsets on the host (what
    an attention backend plans from)."""

    ids: torch.Tensor
    pos: torch.Tensor
    cu: torch.Tensor
    cu_host: torch.Tensor


def eager_forward(
    model: PackedEncoder,
    attn: AttentionBackend,
    output_heads: OutputHeads,
    causal: bool,
    on_device: DeviceBatch,
    batch: RunnerInput,
    planned: Callable[[], None] | None = None,
) -> RunnerOutput:
    """Plan the attention, run the model, apply the heads: every runner's eager batch.
    ``planned`` runs right after the plan (the GPU runner marks its staging free there)."""
    attn.plan(on_device.cu_host, causal, keys=batch.keys)
    if planned is not None:
        planned()
    hidden = model(on_device.ids, on_device.pos, attn)
    # Rare (include_prompt: false models only): a small pageable copy is fine here.
    skip = None if batch.skip is None else torch.from_numpy(batch.skip).to(hidden.device)
    pooled, rows = output_heads(hidden, on_device.cu, skip, batch.spans)
    return RunnerOutput(pooled, hidden if batch.keep_hidden else None, rows)

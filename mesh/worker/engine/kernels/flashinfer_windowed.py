"""CUDA attention for a windowed model's batches that its window cuts (ModernBERT's local
layers, Gemma 3's sliding ones): FlashInfer fa2 ragged prefill with the window as a mask.

A planned batch holds two FlashInfer plans: a plain one (:class:`FlashInferRagged`) for the
global layers, and one with the band of the model's window as a custom mask for the local
layers; ``run(q, k, v, window=w)`` picks by whether ``w`` is None. Grouped SDPA ran these
batches (nearly every 16k-token batch of corpus texts holds one sequence past the window),
so ModernBERT-base and EmbeddingGemma-300m ran 0.08 and 0.03-0.056 M tok/s on the H200,
below sentence-transformers (0.12 / 0.10), while BERT-base on FlashInfer ran 2.4 M. Here
they ran 0.69 and 0.38 M tok/s (docs/performance.md; its GPU tests passed there, at
head_dim 64, 128 and 256).

Why a custom mask rather than FlashInfer's ``window_left``: that bounds keys on the left
only, and the bidirectional windows bound both sides; one mask serves both kinds (causal
Gemma 3 included), through the same compiled module as the plain plan. The mask holds, per
sequence of ``l`` tokens, ``l x l`` booleans row-major (query rows, key columns), sequences
concatenated in batch order (:func:`band_mask`), as FlashInfer's ragged ``custom_mask`` wants.

Why the boolean ``custom_mask`` and device offsets (read in FlashInfer's source, main of
2026-08; what 0.7.2 does with them was then checked by the GPU tests): FlashInfer packs that mask into bits per sequence
(``segment_packbits``, each sequence from a byte boundary), whereas its ragged ``plan``
given a ``packed_custom_mask`` offsets the sequences by their element counts; and
``segment_packbits`` wants the offsets on the mask's device (older releases do not move
them there). It reads its output size back, so a plan costs one host sync (the host waits
for the batch before): this backend runs eagerly, never in a graph.

Costs: the kernel still computes every ``l x l`` tile of a sequence (a custom mask skips
none), fine at corpus lengths (a few hundred tokens, windows of 64-256 either side); the
mask takes ``sum(l * l)`` bytes and its build two int32 temporaries of that length at most
(for two 8k-token sequences in one batch, ~1.1 GB for a moment). The host sync of each
masked plan also costs the worker's two-deep pipeline on these batches: packing the mask
here, with its sizes known on the host, would avoid it (not done). The first plan on a machine
without FlashInfer's JIT cache also builds its quantization module (``segment_packbits``),
as the first plain plan builds the prefill module.

Not here: a bias (MPNet), more than one window size per model, and ``plan(keys=)``
(ColBERT query expansion): ``gpu.GpuRunner`` runs those batches on grouped SDPA.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.kernels.flashinfer_attention import (
    FLASHINFER_HEAD_DIMS,
    WORKSPACE_BYTES,
    FlashInferRagged,
)
from mesh.worker.engine.models.base import PackedEncoder

# Which backend runs a windowed model's batches that its window cuts: "flashinfer" (the
# default: this module, where it applies) or "sdpa" (grouped SDPA, the path before it), to
# fall back to should this one misbehave on a GPU.
WINDOW_MASK_ENV = "EMBEDMESH_WINDOW_MASK"
WINDOW_MASK_CHOICES = ("flashinfer", "sdpa")
# Head dims this backend serves: those the plain path was checked on (FLASHINFER_HEAD_DIMS),
# and EmbeddingGemma's 256, whose probe (tests/gpu/test_flashinfer_windowed_gpu.py) and
# windowed family test passed on the H200: 0.056 -> 0.376 M tok/s there.
WINDOWED_HEAD_DIMS = (*FLASHINFER_HEAD_DIMS, 256)


def band_mask(
    lengths: torch.Tensor, rows: int, size: int, window: int, causal: bool
) -> torch.Tensor:
    """FlashInfer's flattened ragged custom mask (bool ``[size]``, on ``lengths``' device) of
    a window: for each sequence of ``l`` tokens (``lengths``, int64 ``[n]``), ``l x l``
    row-major with ``allowed[i, j] = |i - j| <= window``, and ``j <= i`` too when causal, as
    :func:`.attention.sequence_mask` (and grouped SDPA) limit it. ``rows`` (``sum(l)``) and
    ``size`` (``sum(l * l)``) come from the host so that nothing here reads the device."""
    device = lengths.device
    # Each query row's sequence length, and its position i in the sequence.
    row_len = torch.repeat_interleave(lengths, lengths, output_size=rows)
    seq_start = torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths, output_size=rows
    )
    pos = torch.arange(rows, device=device) - seq_start
    # Element e of row r is key j = e - first[r]; so i - j = (i + first[r]) - e.
    first = torch.cumsum(row_len, 0) - row_len
    # The [size] index tensors dominate the memory: int32 where the mask allows (a 16k-token
    # batch's is at most 16384^2 < 2^31 elements), and at most two of them alive at once.
    index = torch.int32 if size < 2**31 else torch.int64
    row_of = torch.repeat_interleave(
        torch.arange(rows, device=device, dtype=index), row_len, output_size=size
    )
    diff = (pos + first).to(index)[row_of]
    del row_of
    diff.sub_(torch.arange(size, device=device, dtype=index))
    return (diff <= window) & (diff >= (0 if causal else -window))


class FlashInferWindowed(AttentionBackend):
    """``AttentionBackend`` (a window, no bias, no keys) over FlashInfer fa2 ragged
    prefill for a model whose local layers all have the one ``window``; eager only. The
    global layers' plan uses ``workspace`` (the runner's, shared as its other wrappers share
    it); the masked plan gets one of its own."""

    takes_keys = False  # grouped SDPA runs those batches
    takes_bias = False
    takes_window = True  # applied, never dropped: windows_covered stays False

    def __init__(
        self,
        heads: tuple[int, int, int],
        dtype: torch.dtype,
        device: torch.device,
        window: int,
        workspace: torch.Tensor | None = None,
    ) -> None:
        import flashinfer

        self.num_heads, self.num_kv_heads, self.head_dim = heads
        self.dtype = dtype
        self.device = device
        self.window = window
        self.full = FlashInferRagged(heads, dtype, device, None, workspace)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.banded = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        # As FlashInferRagged's: plan() stages through FlashInfer's pinned host buffer, so
        # the next plan waits until the device has taken the last one.
        self._planned: torch.cuda.Event | None = None

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        causal: bool,
        scale: float | None = None,
        *,
        keys: np.ndarray | None = None,
    ) -> None:
        self.check_keys(keys)
        self.full.plan(cu_seqlens, causal, scale)
        cu = cu_seqlens.to("cpu", torch.int64)
        lengths = cu[1:] - cu[:-1]
        rows, size = int(cu[-1]), int((lengths * lengths).sum())
        if self._planned is not None:
            self._planned.synchronize()
        # cu_seqlens is the runner's pinned staging, kept until after plan (gpu.py).
        cu_d = cu_seqlens.to(self.device, non_blocking=True).to(torch.int32)
        mask = band_mask((cu_d[1:] - cu_d[:-1]).long(), rows, size, self.window, causal)
        self.banded.plan(
            cu_d,
            cu_d,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            custom_mask=mask,
            # The mask says it all (FlashInfer ignores causal beside one); False keeps
            # its work split from assuming a causal triangle.
            causal=False,
            sm_scale=scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._planned = torch.cuda.Event()
        self._planned.record()

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        if bias is not None:
            self.refuse("attention bias")
        if window is None:
            return self.full.run(q, k, v)
        if window != self.window:
            raise ValueError(f"planned for window {self.window}, asked for {window}")
        return self.banded.run(q, k, v)


def windowed_backend(
    model: PackedEncoder,
    heads: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    workspace: torch.Tensor | None = None,
) -> FlashInferWindowed | None:
    """The backend for ``model``'s batches its window cuts, or None where grouped SDPA keeps
    them: ``EMBEDMESH_WINDOW_MASK=sdpa``, no single window (``model.single_window``), or a
    head_dim outside ``WINDOWED_HEAD_DIMS``."""
    choice = os.environ.get(WINDOW_MASK_ENV, "flashinfer")
    if choice not in WINDOW_MASK_CHOICES:
        raise ValueError(f"{WINDOW_MASK_ENV}={choice!r}: one of {WINDOW_MASK_CHOICES}")
    window = model.single_window
    if choice == "sdpa" or window is None or heads[2] not in WINDOWED_HEAD_DIMS:
        return None
    return FlashInferWindowed(heads, dtype, device, window, workspace)

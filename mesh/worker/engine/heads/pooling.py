"""Packed-batch bookkeeping and pooling over packed tokens, eager and inside CUDA graphs.

Everything here is vectorized over the batch (no Python loop over sequences or tokens) and
stays on the tensors' device, so that the GPU path can reuse it unchanged. Sums are taken in
fp32 whatever the model's dtype, because a half-precision sum over hundreds of tokens loses
digits.

A pooling spec is one mode or several joined by ``+`` (``"mean"``, ``"cls+mean"``): several
modes concatenate their vectors in that order, as sentence-transformers' ``Pooling`` does.

``skip`` (per sequence) leaves that many leading tokens out of the pooling: the prompt, for a
model whose Pooling says ``include_prompt: false`` (sentence-transformers masks the prompt's
tokens; ``weightedmean`` keeps the remaining tokens' position weights, ``cls`` takes the first
token after the prompt, ``last`` is unaffected). Left-out tokens go to a spare slot past the
real ones, which is never read: the same trick the graphs use for their padding rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import cast

import numpy as np
import torch

from mesh.worker.engine.card import Pooling

# Modes that take one row per sequence, and modes that reduce over every row of a sequence.
_PICKING = ("cls", "last")
_REDUCING = ("mean", "mean_sqrt_len", "weightedmean", "max")


def pooling_modes(spec: str) -> tuple[Pooling, ...]:
    """``"cls+mean"`` -> ``("cls", "mean")``; raises ValueError for an unknown mode."""
    modes = tuple(spec.split("+"))
    for mode in modes:
        if mode not in _PICKING + _REDUCING:
            raise ValueError(f"unknown pooling {mode!r} in {spec!r}")
    return cast("tuple[Pooling, ...]", modes)  # each checked against the modes above


def seq_lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``int64[n]`` lengths from ``cu_seqlens[n + 1]``."""
    return (cu_seqlens[1:] - cu_seqlens[:-1]).long()


def segment_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``int64[total]``: the index of the sequence each packed token belongs to."""
    n = cu_seqlens.numel() - 1
    seqs = torch.arange(n, device=cu_seqlens.device)
    # output_size spares a device-to-host sync on CUDA.
    return torch.repeat_interleave(seqs, seq_lengths(cu_seqlens), output_size=total)


def positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """``int64[total]``: each token's position inside its own sequence (restarts at 0)."""
    starts = torch.repeat_interleave(
        cu_seqlens[:-1].long(), seq_lengths(cu_seqlens), output_size=total
    )
    return torch.arange(total, device=cu_seqlens.device) - starts


def pool(
    hidden: torch.Tensor,
    cu_seqlens: torch.Tensor,
    spec: str,
    skip: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool ``hidden: [T, H]`` per sequence into ``float32 [n, H * modes]``, leaving out the
    first ``skip[i]`` tokens of sequence i when ``skip`` (int64 ``[n]``, each below its
    sequence's length) is given.

    What sentence-transformers computes over a padded batch, here without padding to mask:

    - ``cls``: the first token; ``last``: the last token (Qwen3-Embedding);
    - ``mean``: the tokens' mean; ``mean_sqrt_len``: their sum over sqrt(length);
    - ``weightedmean``: weights 1..L by position, sum(w * h) / sum(w);
    - ``max``: per component, the largest value over the tokens.

    Empty sequences (refused by the engine upstream) pool to zeros for the means and to -inf
    for ``max``.
    """
    modes = pooling_modes(spec)
    total, n = hidden.shape[0], cu_seqlens.numel() - 1
    starts = cu_seqlens[:-1].long()
    seg: torch.Tensor | None = None
    sums: torch.Tensor | None = None
    outs = []
    for mode in modes:
        if mode == "cls":
            outs.append(hidden[starts if skip is None else starts + skip].float())
            continue
        if mode == "last":
            outs.append(hidden[cu_seqlens[1:].long() - 1].float())
            continue
        if seg is None:
            seg = segment_ids(cu_seqlens, total)
            pos = positions(cu_seqlens, total)
            lengths = seq_lengths(cu_seqlens)
            first = torch.zeros_like(lengths) if skip is None else skip
            if skip is not None:
                seg = torch.where(pos < skip[seg], n, seg)  # the prompt: to the spare slot
            # The sum of the position weights p + 1 over the pooled positions first..L-1.
            wtotal = (lengths * (lengths + 1) - first * (first + 1)).float() / 2
            counts = (lengths - first).clamp_min(1).float()
        if mode in ("mean", "mean_sqrt_len"):
            if sums is None:  # "mean+mean_sqrt_len" shares one sum
                sums = _segment_sum(hidden.float(), seg, n + 1)[:n]
            outs.append(sums / (counts if mode == "mean" else counts.sqrt())[:, None])
        elif mode == "weightedmean":
            weights = (pos + 1).float()
            wsums = _segment_sum(hidden.float() * weights[:, None], seg, n + 1)[:n]
            # exact in fp32 for any length a model takes
            outs.append(wsums / wtotal.clamp_min(1.0)[:, None])
        else:
            outs.append(_segment_max(hidden.float(), seg, n + 1)[:n])
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def _segment_sum(rows: torch.Tensor, seg: torch.Tensor, slots: int) -> torch.Tensor:
    sums = torch.zeros(slots, rows.shape[1], dtype=torch.float32, device=rows.device)
    return sums.index_add_(0, seg, rows)


def _segment_max(rows: torch.Tensor, seg: torch.Tensor, slots: int) -> torch.Tensor:
    out = torch.full((slots, rows.shape[1]), float("-inf"), dtype=rows.dtype, device=rows.device)
    # scatter_reduce: one kernel, no host sync, static shapes: it can be captured in a graph.
    return out.scatter_reduce_(0, seg[:, None].expand(-1, rows.shape[1]), rows, "amax")


# ---- inside a CUDA graph: shapes fixed per bucket ----------------------------------------------


@dataclass
class PoolBuffers:
    """What :func:`static_pool` reads besides the hidden states, for a bucket of ``rows`` rows
    and ``slots`` sequence slots; a field a spec does not need is empty.

    - ``index``: int64 ``[rows]``, each row's slot; padding rows point at a spare slot
      ``slots`` whose result is never read (reducing modes);
    - ``pick``: int64 ``[picks * slots]``, the row each picking mode (cls, last) takes per
      slot, one block of ``slots`` per picking mode in spec order;
    - ``scale``: float32 ``[slots + 1]``, 1 / length per slot, 0 for unused ones (means);
    - ``weight``: float32 ``[rows]``, position + 1 of each row, 0 on padding (weightedmean).
    """

    index: torch.Tensor
    pick: torch.Tensor
    scale: torch.Tensor
    weight: torch.Tensor

    @staticmethod
    def sizes(spec: str, rows: int, slots: int) -> dict[str, int]:
        modes = pooling_modes(spec)
        reducing = any(m in _REDUCING for m in modes)
        return {
            "index": rows if reducing else 0,
            "pick": slots * sum(m in _PICKING for m in modes),
            "scale": slots + 1 if reducing else 0,
            "weight": rows if "weightedmean" in modes else 0,
        }

    @classmethod
    def empty(
        cls,
        spec: str,
        rows: int,
        slots: int,
        device: torch.device | None = None,
        pin_memory: bool = False,
    ) -> PoolBuffers:
        dtypes = {"index": torch.int64, "pick": torch.int64}
        return cls(
            **{
                name: torch.zeros(
                    size,
                    dtype=dtypes.get(name, torch.float32),
                    device=device,
                    pin_memory=pin_memory,
                )
                for name, size in cls.sizes(spec, rows, slots).items()
            }
        )

    def head(self, spec: str, rows: int, slots: int) -> PoolBuffers:
        """Views of the first entries, as many as a ``rows`` x ``slots`` bucket reads."""
        sizes = self.sizes(spec, rows, slots)
        return PoolBuffers(**{name: getattr(self, name)[:size] for name, size in sizes.items()})

    def copy_(self, src: PoolBuffers) -> None:
        """Asynchronous copies of ``src`` (pinned host buffers of the same sizes) into these."""
        for f in fields(self):
            dst = getattr(self, f.name)
            if dst.numel():
                dst.copy_(getattr(src, f.name), non_blocking=True)


def fill_pool_indices(
    spec: str,
    seg: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    bufs: PoolBuffers,
    rows: int,
    slots: int,
    skip: np.ndarray | None = None,
) -> None:
    """Write :func:`static_pool`'s inputs for one batch into host ``bufs`` (sized by
    ``PoolBuffers.sizes(spec, rows, slots)``): ``seg`` is each real token's sequence,
    ``offsets`` the batch's ``n + 1`` offsets, ``rows`` the bucket's rows, ``skip`` the
    leading tokens of each sequence left out (see :func:`pool`)."""
    modes = pooling_modes(spec)
    n, total = len(lengths), seg.shape[0]
    starts = offsets[:-1]
    if bufs.index.numel():
        index = bufs.index.numpy()
        index[:total] = seg
        if skip is not None:  # the prompt's rows go to the spare slot, as padding rows do
            index[:total][np.arange(total) - starts[seg] < skip[seg]] = slots
        index[total:rows] = slots  # padding rows go to the spare slot
        scale = bufs.scale.numpy()
        scale[:n] = 1.0 / (lengths if skip is None else lengths - skip)
        scale[n:] = 0.0
    if bufs.weight.numel():
        weight = bufs.weight.numpy()
        weight[:total] = np.arange(1, total + 1) - starts[seg]
        weight[total:rows] = 0.0
    pick = bufs.pick.numpy()
    for k, mode in enumerate(m for m in modes if m in _PICKING):
        block = pick[k * slots : (k + 1) * slots]
        if mode == "cls":
            block[:n] = starts if skip is None else starts + skip
        else:
            block[:n] = offsets[1:] - 1
        block[n:] = 0


def static_pool(hidden: torch.Tensor, bufs: PoolBuffers, spec: str, slots: int) -> torch.Tensor:
    """Pooling with shapes fixed per bucket, so it can live inside the bucket's graph:
    ``float32 [slots, H * modes]``, equal to :func:`pool` on the real slots.

    One ``index_add_`` (means), ``scatter_reduce_`` (max) or gather (cls, last) per mode
    replaces the dozen launches of :func:`pool` per batch (host time the small models' 2 ms
    batches cannot spare); none synchronizes with the host, so all of them are captured.
    """
    outs = []
    picked = 0
    rows: torch.Tensor | None = None
    sums: torch.Tensor | None = None
    for mode in pooling_modes(spec):
        if mode in _PICKING:
            outs.append(hidden[bufs.pick[picked * slots : (picked + 1) * slots]].float())
            picked += 1
            continue
        if rows is None:
            rows = hidden.float()
        if mode in ("mean", "mean_sqrt_len"):
            if sums is None:
                sums = _segment_sum(rows, bufs.index, slots + 1)
            scale = bufs.scale if mode == "mean" else bufs.scale.sqrt()
            outs.append((sums * scale[:, None])[:slots])
        elif mode == "weightedmean":
            wsums = _segment_sum(rows * bufs.weight[:, None], bufs.index, slots + 1)
            total = torch.zeros(slots + 1, dtype=torch.float32, device=hidden.device)
            total.index_add_(0, bufs.index, bufs.weight)
            outs.append((wsums / total.clamp_min(1.0)[:, None])[:slots])
        else:
            outs.append(_segment_max(rows, bufs.index, slots + 1)[:slots])
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

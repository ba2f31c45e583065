"""Packed-batch bookkeeping and pooling over packed tokens.

Everything here is vectorized over the batch (no Python loop over sequences or tokens) and
stays on the tensors' device, so that the GPU path can reuse it unchanged.
"""

from __future__ import annotations

import torch

from mesh.worker.engine.card import Pooling


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


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: Pooling) -> torch.Tensor:
    """Pool ``hidden: [T, H]`` per sequence into ``float32 [n, H]``.

    ``mean`` averages a sequence's tokens (all of them: there is no padding to mask, which
    is what sentence-transformers' masked mean computes); ``cls`` takes its first token,
    ``last`` its last token (Qwen3-Embedding). Sums are taken in fp32 whatever the model's
    dtype, because a half-precision sum over hundreds of tokens loses digits.
    """
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long()].float()
    if mode == "last":
        return hidden[cu_seqlens[1:].long() - 1].float()
    if mode == "mean":
        n = cu_seqlens.numel() - 1
        seg = segment_ids(cu_seqlens, hidden.shape[0])
        sums = torch.zeros(n, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seg, hidden.float())
        # clamp: an empty sequence pools to zeros instead of NaN.
        return sums / seq_lengths(cu_seqlens).clamp_min(1).to(sums.dtype)[:, None]
    raise ValueError(f"unknown pooling {mode!r}")

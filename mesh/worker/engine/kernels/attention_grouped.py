"""The CUDA attention of the models that need masks (MPNet's relative bias, ModernBERT's and
Gemma 3's sliding windows): sequences sorted by length, padded into groups, one masked SDPA
call per group and layer.

Why not :class:`~mesh.worker.engine.kernels.attention.SdpaPerSequence` there: a loop of one SDPA
call (and one mask) per sequence per layer is a few thousand small kernels a batch. On the
H200 it ran those families at 8-14 thousand tokens/s (`bench/families.py`:
ModernBERT-base 0.008 M tok/s, EmbeddingGemma-300m 0.008, MPNet-base 0.014; BERT-base on
FlashInfer 2.42 M), 15-30 times slower than sentence-transformers' padded batches. Here a
batch costs a few calls per layer, its masks are built once per batch (per window size and
per bias), and padding stays within ``waste`` of the real tokens.

Same contract as the other backends (``attention.py``): ``plan`` once per batch, ``run``
per layer; it takes keys, a bias and a window. Not capturable in a CUDA graph (``plan``
reads the lengths on the host), so the batches that need masks still run eagerly (for
ModernBERT and Gemma 3 only those holding a sequence longer than the local window:
``gpu.GpuRunner`` runs the others on FlashInfer and the graphs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mesh.worker.engine.kernels.attention import AttentionBackend, position_limits


@dataclass
class _Group:
    index: torch.Tensor  # [g, w] token rows gathered (padding: the sequence's first token)
    valid: torch.Tensor  # [g, w] real tokens
    keys: torch.Tensor  # [g, w] tokens that are keys (real, and within the sequence's keys)
    dest: torch.Tensor  # index[valid]: where the group's real outputs go
    # Where the real tokens sit in the flattened [g * w] slots: an integer gather, because
    # indexing with ``valid`` (a boolean mask) reads its count back: a device sync a layer.
    flat: torch.Tensor
    masks: dict[tuple[int | None, int], torch.Tensor] = field(default_factory=dict)

    def to(self, device: torch.device) -> _Group:
        """The group on ``device``, its tensors moved in one copy (one host sync a batch, not
        five a group)."""
        parts = (self.index, self.valid, self.keys, self.dest, self.flat)
        packed = torch.cat([t.reshape(-1).to(torch.int64) for t in parts]).to(device)
        pieces = packed.split([t.numel() for t in parts])
        index, valid, keys, dest, flat = (
            p.view(t.shape) for p, t in zip(pieces, parts, strict=True)
        )
        return _Group(index, valid.bool(), keys.bool(), dest, flat)


# The SDPA kernels grouped SDPA lets torch choose among: all but cuDNN's. On sm90 with
# cuDNN > 9.15, torch (2.11+, CUDA 13 builds) puts cuDNN first, and cuDNN builds and caches an
# execution graph per input shape, a cost paid on the host. Grouped SDPA's shapes (group size x
# width) are new in nearly every batch of real traffic: on the H200, MPNet ran 0.235 M tok/s
# over the families bench's 20 repeated batches but 0.044 through HTTP, its worker busy on
# 1.8 cores. The memory-efficient kernel takes the float mask with no per-shape plan. Not
# measured yet with this choice: bench/masked_probe.py times each (None: torch's own order).
NO_CUDNN = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


class SdpaGrouped(AttentionBackend):
    """Length-sorted groups of padded sequences, one SDPA a group (see the module doc)."""

    takes_keys = True
    takes_bias = True
    takes_window = True
    backends: tuple[SDPBackend, ...] | None = NO_CUDNN  # see NO_CUDNN

    def __init__(self, max_group_tokens: int = 8192, waste: float = 1.25) -> None:
        self._max_group_tokens = max_group_tokens
        self._waste = waste
        self._groups: list[_Group] = []
        self._causal = False
        self._scale: float | None = None

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        causal: bool,
        scale: float | None = None,
        *,
        keys: np.ndarray | None = None,
    ) -> None:
        self.check_keys(keys)
        self._causal, self._scale = causal, scale
        cu = cu_seqlens.tolist()  # one host sync per batch
        lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
        nkeys = lens if keys is None else [min(int(k), n) for k, n in zip(keys, lens, strict=True)]
        order = sorted((i for i in range(len(lens)) if lens[i] > 0), key=lambda i: -lens[i])
        self._groups = []
        group: list[int] = []
        for i in order:
            if group:
                padded = lens[group[0]] * (len(group) + 1)
                real = sum(lens[j] for j in group) + lens[i]
                if padded > self._max_group_tokens or padded > self._waste * real:
                    self._groups.append(self._group(group, cu, lens, nkeys, cu_seqlens.device))
                    group = []
            group.append(i)
        if group:
            self._groups.append(self._group(group, cu, lens, nkeys, cu_seqlens.device))

    @staticmethod
    def _group(
        group: list[int], cu: list[int], lens: list[int], nkeys: list[int], device: torch.device
    ) -> _Group:
        width = lens[group[0]]
        starts = torch.tensor([cu[i] for i in group], device=device)
        cols = torch.arange(width, device=device)
        valid = cols[None, :] < torch.tensor([lens[i] for i in group], device=device)[:, None]
        keys = cols[None, :] < torch.tensor([nkeys[i] for i in group], device=device)[:, None]
        index = starts[:, None] + torch.where(valid, cols[None, :], 0)
        flat = torch.arange(valid.numel(), device=device)[valid.reshape(-1)]
        return _Group(index, valid, keys, index[valid], flat)

    def _mask(self, g: _Group, window: int | None, bias: torch.Tensor | None) -> torch.Tensor:
        """The group's ``attn_mask``: its keys, the causal and window limits; with a bias, the
        bias where allowed and -inf elsewhere. Padding queries see every key of their
        sequence, so no row is all -inf (their outputs are dropped anyway)."""
        cache = (window, 0 if bias is None else id(bias))
        mask = g.masks.get(cache)
        if mask is not None:
            return mask
        width = g.index.shape[1]
        allowed = g.keys[:, None, None, :]  # [g, 1, 1, w]
        limits = position_limits(width, self._causal, window, g.index.device)
        if limits is not None:
            allowed = allowed & limits
        padding_rows = ~g.valid[:, None, :, None] & g.keys[:, None, None, :]
        allowed = allowed | padding_rows  # [g, 1, w, w]
        if bias is None:
            mask = allowed
        else:
            mask = bias[None, :, :width, :width].masked_fill(~allowed, float("-inf"))
        g.masks[cache] = mask
        return mask

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        bias, window = self.masks(bias, window)
        out = torch.empty_like(q)
        gqa = q.shape[1] != k.shape[1]
        if self._groups and self._groups[0].index.device != q.device:
            # Planned from the host copy of cu_seqlens: moved once, at the first layer.
            self._groups = [g.to(q.device) for g in self._groups]
        with sdpa_kernel(list(self.backends)) if self.backends else contextlib.nullcontext():
            for g in self._groups:
                o = F.scaled_dot_product_attention(
                    q[g.index].transpose(1, 2),
                    k[g.index].transpose(1, 2),
                    v[g.index].transpose(1, 2),
                    attn_mask=self._mask(g, window, bias),
                    scale=self._scale,
                    enable_gqa=gqa,
                )
                rows = o.transpose(1, 2).reshape(-1, o.shape[1], o.shape[3])  # [g * w, H, D]
                out[g.dest] = rows[g.flat]
        return out

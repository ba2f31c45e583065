"""Attention over packed variable-length batches, behind a backend seam.

The models never see padding: a batch is one ``[total_tokens, ...]`` tensor and
``cu_seqlens`` (``int32[n + 1]``, ``cu_seqlens[i]:cu_seqlens[i + 1]`` are the tokens of
sequence ``i``). Attention is the only layer that must know where sequences start, so it is
the only seam between the CPU path and the GPU path:

- ``plan(cu_seqlens, causal)`` is called once per batch, before the first layer. A backend
  does its per-batch bookkeeping here (index tensors, masks, FlashInfer's
  ``BatchPrefillWithRaggedKVCacheWrapper.plan(qo_indptr=cu_seqlens, kv_indptr=cu_seqlens,
  num_qo_heads, num_kv_heads, head_dim, causal=...)``), so that layers pay none of it.
- ``run(q, k, v)`` is called once per layer with ``q: [T, Hq, D]``, ``k, v: [T, Hkv, D]``
  (``Hq`` a multiple of ``Hkv``: grouped-query attention), all of the model's dtype, and
  returns ``[T, Hq, D]``. Softmax scale is ``D ** -0.5`` unless ``plan`` was given one.
  Tokens of one sequence attend only to tokens of the same sequence (and, when causal, to
  those not after themselves).

Every backend declares, as class attributes, what it honours of the rest, and refuses by
name (ValueError naming the argument and the backend) what it does not; the runner picks a
backend by these declarations:

- ``takes_bias``: ``run(..., bias=)``, an additive relative-position bias ``[Hq, L, L]`` of
  which each sequence adds its top-left ``[Hq, l, l]`` to the scaled scores (MPNet);
- ``takes_window``: ``run(..., window=)``, a sliding window (a token sees keys at most
  ``window`` positions away; ModernBERT's and Gemma 3's local layers);
- ``takes_keys``: ``plan(..., keys=)``, int ``[n]``, how many leading tokens of each
  sequence are keys (a ColBERT query's [MASK] expansion, which no token attends to, comes
  last: ``late_interaction.key_lengths``); every token is still a query;
- ``windows_covered`` (an instance attribute, False by default): the backend is planned
  only with batches no window cuts, so it runs a windowed layer as full attention, exact
  there. A window changes nothing for a sequence of at most ``window + 1`` tokens
  (:func:`sequence_mask`), so a model with windows and no bias says how long a sequence may
  be and need no mask (``mask_free_length``, from :func:`mask_free_length`);
  ``gpu.GpuRunner`` sets it on the mask-free backends it plans only with such batches.

The SDPA backends take all three; ``flashinfer_windowed.FlashInferWindowed`` a window;
FlashInfer's plain backend and torch's varlen keys only.

A FlashInfer backend (GPU) implements the same two calls; it must keep ``plan`` free of
device-to-host syncs after the first call per token bucket so that CUDA graphs can be
captured around ``run``. This module never imports flashinfer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar, NoReturn

import numpy as np
import torch
import torch.nn.functional as F

# What every backend states, as class attributes (see the module docstring).
DECLARATIONS = ("takes_keys", "takes_bias", "takes_window")


class AttentionBackend(ABC):
    """What every attention backend is; see the module docstring."""

    takes_keys: ClassVar[bool]
    takes_bias: ClassVar[bool]
    takes_window: ClassVar[bool]
    # Set by the runner on a backend it plans only with batches no window cuts.
    windows_covered: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [d for d in DECLARATIONS if not hasattr(cls, d)]
        if missing:
            raise TypeError(f"attention backend {cls.__name__} does not declare {missing}")

    @abstractmethod
    def plan(
        self,
        cu_seqlens: torch.Tensor,
        causal: bool,
        scale: float | None = None,
        *,
        keys: np.ndarray | None = None,
    ) -> None:
        """Prepare for one packed batch; called once before the layers run."""

    @abstractmethod
    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """Attention of one layer: ``[T, Hq, D], [T, Hkv, D], [T, Hkv, D] -> [T, Hq, D]``."""

    def refuse(self, argument: str) -> NoReturn:
        raise ValueError(f"{type(self).__name__} takes no {argument}")

    def check_keys(self, keys: np.ndarray | None) -> None:
        """For ``plan``: refuse ``keys`` where the backend does not take them."""
        if keys is not None and not self.takes_keys:
            self.refuse("keys= (a query's expansion left out of the keys)")

    def masks(
        self, bias: torch.Tensor | None, window: int | None
    ) -> tuple[torch.Tensor | None, int | None]:
        """For ``run``: the bias and window this backend applies (a covered window dropped);
        refuses by name what it does not take."""
        if bias is not None and not self.takes_bias:
            self.refuse("attention bias")
        if window is not None:
            if self.windows_covered:
                return bias, None  # planned only with sequences the window does not cut
            if not self.takes_window:
                self.refuse("attention window")
        return bias, window


class SdpaPerSequence(AttentionBackend):
    """CPU backend: one ``scaled_dot_product_attention`` call per sequence. (On CUDA the
    models that need masks run ``attention_grouped.SdpaGrouped`` instead: see there why.)

    Chosen over length-sorted padded groups (``SdpaGrouped``, then with groups of at most
    4096 padded tokens) by measurement: 2 torch threads, all-MiniLM-L6-v2 fp32, 8192-token
    batches of shuffled corpus texts (40 % queries of ~18 tokens, 60 % passages of ~190, cut at 256; ~70
    sequences a batch), best of 4 interleaved passes: 1.21 s a batch per sequence vs 1.31 s
    bucketed; 420 queries alone (8192 tokens): 1.21 s vs 1.22 s. The Python loop over
    sequences costs less than gathering into padded groups and scattering back, and no
    work is spent on padding. Attention is ~16 % of the forward at these lengths; GEMMs are ~70 %.
    """

    takes_keys = True
    takes_bias = True
    takes_window = True

    def __init__(self) -> None:
        self._bounds: list[tuple[int, int, int]] = []
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
        # One host sync per batch, not per layer.
        cu = cu_seqlens.tolist()
        n = len(cu) - 1
        ends = (
            [cu[i + 1] for i in range(n)]
            if keys is None
            else [cu[i] + int(k) for i, k in enumerate(keys)]
        )
        self._bounds = [(cu[i], cu[i + 1], ends[i]) for i in range(n) if cu[i + 1] > cu[i]]
        self._causal = causal
        self._scale = scale

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
        for start, end, keys_end in self._bounds:
            mask = sequence_mask(end - start, self._causal, bias, window, q.device)
            if mask is not None and keys_end < end:
                mask = mask[..., : keys_end - start]
            # [L, H, D] -> [1, H, L, D], strides only. 4-D, because CPU SDPA only takes its
            # fused (flash) kernel for 4-D inputs; 3-D falls back to the slower math path.
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1)[None],
                k[start:keys_end].transpose(0, 1)[None],
                v[start:keys_end].transpose(0, 1)[None],
                attn_mask=mask,
                is_causal=self._causal and mask is None,
                scale=self._scale,
                enable_gqa=gqa,
            )
            out[start:end] = o[0].transpose(0, 1)
        return out


def sequence_mask(
    n: int,
    causal: bool,
    bias: torch.Tensor | None,
    window: int | None,
    device: torch.device,
) -> torch.Tensor | None:
    """SDPA's ``attn_mask`` for one sequence of ``n`` tokens: None when ``is_causal`` (or
    nothing) says it all, a boolean ``[1, 1, n, n]`` for a window, a float ``[1, H, n, n]``
    with a bias (the causal and window limits as -inf in it)."""
    if bias is None and (window is None or n - 1 <= window):
        return None  # no window cuts it: is_causal (or nothing) says it all
    allowed = position_limits(n, causal, window, device)
    if bias is None:
        assert allowed is not None  # the window cuts this sequence (checked above)
        return allowed[None, None]
    scores = bias[:, :n, :n]
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores[None]


def position_limits(
    n: int, causal: bool, window: int | None, device: torch.device
) -> torch.Tensor | None:
    """bool ``[n, n]``: which keys (columns) each query (row) of an ``n``-token sequence may
    see under a ``window`` (``|i - j| <= window``, only where the sequence is longer than
    ``window + 1``) and causality (``j <= i``); None where neither limits anything."""
    allowed = None
    if window is not None and n - 1 > window:
        i = torch.arange(n, device=device)
        allowed = (i[:, None] - i[None, :]).abs() <= window
    if causal:
        tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        allowed = tril if allowed is None else allowed & tril
    return allowed


def mask_free_length(windows: Iterable[int | None]) -> int | None:
    """The longest sequence that none of ``windows`` (one per layer, None for a global one)
    cuts: a token already sees every key of a sequence of ``n`` tokens when ``n - 1 <=
    window``, as :func:`sequence_mask` and ``SdpaGrouped`` apply it. None without a window."""
    bounds = [w + 1 for w in windows if w is not None]
    return min(bounds) if bounds else None


def mask_free(longest: int, needs_masks: bool, mask_free_length: int | None) -> bool:
    """Whether a batch whose longest sequence has ``longest`` tokens runs without masks (on
    CUDA: the fast backend and graphs): always for a model without masks; for one with windows
    and no bias, when no window cuts that sequence (``longest <= mask_free_length``); never
    for one with a bias (``mask_free_length`` None)."""
    if not needs_masks:
        return True
    return mask_free_length is not None and longest <= mask_free_length


def cpu_backend() -> AttentionBackend:
    """The CPU backend the engine uses."""
    return SdpaPerSequence()

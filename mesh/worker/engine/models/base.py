"""The model base every family subclasses: what the runners and heads may ask of a model.

A family model is ``forward(ids[T], positions[T], attn) -> [T, hidden]`` over a planned
packed batch. Everything else the engine, the CUDA runner and the heads read is declared
here with its type and default, so that no caller probes a model with ``getattr``:

- the shape, read from ``config.json`` in one place (:class:`ModelShape`): hidden size,
  heads (query and key/value), head_dim, layers, vocabulary, norm epsilon;
- what its attention needs: ``position_bias`` (MPNet's relative bias, a class declaration)
  and ``windows`` (each layer's sliding window, None for a global layer), from which
  ``needs_masks``, ``mask_free_length`` and ``single_window`` follow;
- how its non-GEMM parts may run: ``eager_only`` families (no compiled or fused path yet)
  accept any ``kernels`` choice and run eager torch; the others implement
  :meth:`PackedEncoder.select_kernels`;
- ``fold_pair_types`` (a cross-encoder's token type 1 as an id shift; 0 without types) and
  ``word_table`` (the input embeddings a tied head reads: SPLADE's MLM decoder).

An option of the config the family's math does not implement is refused at construction
with NotImplementedError naming it (:meth:`PackedEncoder.check_supported`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from mesh.worker.engine.kernels.attention import AttentionBackend, mask_free_length
from mesh.worker.engine.weights import Weights, WeightSource

KERNELS = ("torch", "compile", "fused")


def check_kernels(kernels: str) -> None:
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}")


@dataclass(frozen=True)
class ModelShape:
    """The config fields every family reads, read once."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    vocab_size: int
    eps: float

    @classmethod
    def read(cls, config: dict[str, Any], eps_key: str, eps_default: float) -> ModelShape:
        """``eps_key``: the family's name for its norm epsilon (``layer_norm_eps``,
        ``rms_norm_eps``, ``norm_eps``) and ``eps_default`` transformers' default for it.
        ``head_dim`` and ``num_key_value_heads`` where the config states them (decoders),
        else ``hidden / heads`` and as many key/value heads as query heads."""
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        return cls(
            hidden=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            num_layers=int(config["num_hidden_layers"]),
            vocab_size=int(config["vocab_size"]),
            eps=float(config.get(eps_key, eps_default)),
        )


class PackedEncoder(nn.Module):
    """The base of every family model; see the module docstring."""

    family: ClassVar[str] = ""
    # The config key of the norm epsilon and transformers' default for it.
    eps_key: ClassVar[tuple[str, float]] = ("layer_norm_eps", 1e-12)
    # A family without a compiled or fused path: use_kernels runs eager torch, and says so.
    eager_only: ClassVar[bool] = False
    # An additive relative-position bias in every layer's attention (MPNet): only the SDPA
    # backends take one, and it changes every batch, however short.
    position_bias: ClassVar[bool] = False

    def __init__(
        self,
        config: dict[str, Any],
        source: WeightSource,
        dtype: torch.dtype,
        device: torch.device | str,
        causal: bool = False,
    ) -> None:
        """Read the shared config fields, then let the family :meth:`build` its weights."""
        super().__init__()
        self.read_shape(config, dtype, causal)
        self.build(config, Weights(source, dtype, device))

    def read_shape(self, config: dict[str, Any], dtype: torch.dtype, causal: bool) -> None:
        """What every family reads of its config, in one place (after checking it)."""
        self.check_supported(config)
        self.causal = causal
        self.dtype = dtype
        self.shape = ModelShape.read(config, *self.eps_key)
        self.hidden = self.shape.hidden
        self.num_heads = self.shape.num_heads
        self.num_kv_heads = self.shape.num_kv_heads
        self.head_dim = self.shape.head_dim
        self.vocab_size = self.shape.vocab_size
        self.eps = self.shape.eps
        # Each layer's sliding window (keys at most this far away), None for a global layer;
        # empty for a family without windows. Set by windowed families in build().
        self.windows: tuple[int | None, ...] = ()
        self.kernels = "torch"
        # A cross-encoder's shift of type-1 ids (fold_pair_types); 0 until folded.
        self.pair_shift = 0

    def build(self, config: dict[str, Any], w: Weights) -> None:
        """The family's own part: read what else its config says, take its weights from
        ``w`` (in the model's dtype, on its device) and make its layers."""
        raise NotImplementedError(f"{type(self).__name__} builds no layers")

    @classmethod
    def check_supported(cls, config: dict[str, Any]) -> None:
        """Refuse (NotImplementedError naming it) a config option the family does not
        implement, rather than serve wrong vectors. Nothing by default."""

    @property
    def heads(self) -> tuple[int, int, int]:
        """(query heads, key/value heads, head_dim): what an attention backend is built for."""
        return self.num_heads, self.num_kv_heads, self.head_dim

    @property
    def mask_free_length(self) -> int | None:
        """The longest sequence no window cuts (None: no window, or a bias, which every batch
        needs): a batch of such sequences runs without masks (:func:`.attention.mask_free`)."""
        return None if self.position_bias else mask_free_length(self.windows)

    @property
    def needs_masks(self) -> bool:
        """Whether some batches need a bias or window that FlashInfer's ragged prefill cannot
        take (``gpu.GpuRunner`` runs those eagerly on a backend that takes it)."""
        return self.position_bias or any(w is not None for w in self.windows)

    @property
    def single_window(self) -> int | None:
        """The one window all local layers share; None without windows, with a bias, or
        with windows of several sizes (``flashinfer_windowed`` builds one band mask)."""
        if self.mask_free_length is None:
            return None
        sizes = {w for w in self.windows if w is not None}
        return sizes.pop() if len(sizes) == 1 else None

    def use_kernels(self, kernels: str, exact_gelu: bool = False) -> str:
        """Run the non-GEMM parts through "torch", "compile" or "fused" (see
        ``Engine.load``); an ``eager_only`` family runs "torch" whatever is asked. Returns
        the kernels in use (``Engine.kernels``)."""
        check_kernels(kernels)
        self.kernels = "torch" if self.eager_only else self.select_kernels(kernels, exact_gelu)
        return self.kernels

    def select_kernels(self, kernels: str, exact_gelu: bool) -> str:
        """A family's own choice of kernels (``use_kernels`` checked the name); returns
        what runs. The base runs eager torch."""
        return "torch"

    def fold_pair_types(self) -> int:
        """A cross-encoder's token type 1 as a shift of the ids (see ``BertEncoder``); 0 for
        a family without token types: its pairs are typed 0."""
        return 0

    def word_table(self) -> torch.Tensor:
        """The input word embeddings ``[vocab, hidden]``, for a head tied to them."""
        raise NotImplementedError(f"{self.family}: no word table a head can share")

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        raise NotImplementedError

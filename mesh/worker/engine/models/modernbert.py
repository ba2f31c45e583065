"""ModernBERT encoder (gte-modernbert, modernbert-embed, ModernBERT-based rerankers) over
packed batches.

Same math as Hugging Face ``ModernBertModel``: token embeddings and a LayerNorm (no
positions there), then pre-LN layers (the first without an attention norm) of
bidirectional attention with rotary positions and a GeGLU MLP (``act(input) * gate``), then
a final LayerNorm. Layers alternate global attention and local attention within a sliding
window of ``local_attention // 2`` tokens either side (``layer_types``, or every
``global_attn_every_n_layers``-th layer global in older configs), each kind with its own
RoPE theta (160k global, 10k local by default). Biases (``norm_bias``, ``attention_bias``,
``mlp_bias``) are taken where the checkpoint has them.

On CUDA the window decides per batch (``mask_free_length``, the window plus one: a token of
a sequence that short sees every key anyway). A batch whose every sequence is that short
(a batch of short queries, say; corpus passages are mostly longer) takes BERT's fast path, FlashInfer (or varlen) attention and
the CUDA graphs per token bucket, the window dropped; a batch holding a longer one runs
FlashInfer eagerly with the window as a custom mask for the local layers (two plans a batch,
``flashinfer_windowed.py``), or torch SDPA over length-sorted padded groups where that does
not apply (``gpu.GpuRunner``). The non-GEMM parts run in eager torch either way (no fused
kernels yet).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.blocks import (
    Activation,
    RopeTables,
    activation,
    apply_rope,
    check_default_rope,
    gated_mlp,
    layer_norm,
    split_qkv,
)
from mesh.worker.engine.weights import Weights

THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
OLD_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


class ModernBertLayer(nn.Module):
    def __init__(self, w: Weights, heads: int, eps: float, window: int | None, act: Activation):
        super().__init__()
        self.heads, self.eps, self.window, self.act = heads, eps, window, act
        self.register_buffer("attn_norm_w", w.optional("attn_norm.weight"))  # layer 0: none
        self.register_buffer("attn_norm_b", w.optional("attn_norm.bias"))
        self.register_buffer("qkv_w", w("attn.Wqkv.weight"))
        self.register_buffer("qkv_b", w.optional("attn.Wqkv.bias"))
        self.register_buffer("o_w", w("attn.Wo.weight"))
        self.register_buffer("o_b", w.optional("attn.Wo.bias"))
        self.register_buffer("mlp_norm_w", w("mlp_norm.weight"))
        self.register_buffer("mlp_norm_b", w.optional("mlp_norm.bias"))
        self.register_buffer("wi_w", w("mlp.Wi.weight"))
        self.register_buffer("wi_b", w.optional("mlp.Wi.bias"))
        self.register_buffer("wo_w", w("mlp.Wo.weight"))
        self.register_buffer("wo_b", w.optional("mlp.Wo.bias"))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        h = x
        if self.attn_norm_w is not None:
            h = layer_norm(x, self.attn_norm_w, self.attn_norm_b, self.eps)
        d = x.shape[1] // self.heads
        q, k, v = split_qkv(F.linear(h, self.qkv_w, self.qkv_b), (self.heads, self.heads, d))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = attn.run(q, k, v, window=self.window).reshape(x.shape)
        x = x + F.linear(a, self.o_w, self.o_b)
        h = layer_norm(x, self.mlp_norm_w, self.mlp_norm_b, self.eps)
        return x + gated_mlp(h, self.wi_w, self.wo_w, self.act, self.wi_b, self.wo_b)


class ModernBertEncoder(PackedEncoder):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    family = "modernbert"
    eps_key = ("norm_eps", 1e-5)
    eager_only = True

    def build(self, config: dict[str, Any], w: Weights) -> None:
        act = activation(str(config.get("hidden_activation", "gelu")), self.family)
        self.layer_types = _layer_types(config)
        window = _window(config)
        # The local layers' window binds only on longer sequences (GpuRunner's choice).
        self.windows = tuple(window if k == "sliding_attention" else None for k in self.layer_types)
        self.rope = RopeTables(config, self.layer_types, _rope_theta, self.head_dim, w.device)
        self.register_buffer("embed", w("embeddings.tok_embeddings.weight"))
        self.register_buffer("embed_norm_w", w("embeddings.norm.weight"))
        self.register_buffer("embed_norm_b", w.optional("embeddings.norm.bias"))
        self.layers = nn.ModuleList(
            ModernBertLayer(w.under(f"layers.{i}."), self.num_heads, self.eps, window, act)
            for i, window in enumerate(self.windows)
        )
        self.register_buffer("final_norm_w", w("final_norm.weight"))
        self.register_buffer("final_norm_b", w.optional("final_norm.bias"))

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = layer_norm(self.embed[ids], self.embed_norm_w, self.embed_norm_b, self.eps)
        rope = self.rope(positions, x.dtype)
        for layer, kind in zip(self.layers, self.layer_types, strict=True):
            x = layer(x, *rope[kind], attn)
        return layer_norm(x, self.final_norm_w, self.final_norm_b, self.eps)


def _window(config: dict[str, Any]) -> int:
    """The local layers' window as a backend's ``run`` takes it: keys at most this far
    away (transformers' ``abs(q - kv) <= local_attention // 2``)."""
    return int(config.get("local_attention", 128)) // 2


def _layer_types(config: dict[str, Any]) -> list[str]:
    n = int(config["num_hidden_layers"])
    every = int(config.get("global_attn_every_n_layers", 3))
    kinds = config.get("layer_types") or [
        "sliding_attention" if i % every else "full_attention" for i in range(n)
    ]
    unknown = set(kinds) - set(THETA)
    if unknown or len(kinds) != n:
        raise NotImplementedError(f"modernbert: layer_types {kinds!r} are not supported")
    return list(kinds)


def _rope_theta(config: dict[str, Any], kind: str) -> float:
    # transformers >= 5 writes rope_parameters per layer type; Hub configs have
    # global_rope_theta / local_rope_theta, and rope_scaling applied to both.
    params = dict((config.get("rope_parameters") or {}).get(kind) or {})
    params.update(config.get("rope_scaling") or {})
    check_default_rope(params, "modernbert")
    return float(params.get("rope_theta", config.get(OLD_THETA_KEYS[kind], THETA[kind])))

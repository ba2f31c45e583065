"""Gemma 3 text decoder as EmbeddingGemma uses it (bidirectional, mean pooled), over packed
batches; causal Gemma 3 checkpoints load too (then last-token pooling by default).

Same math as Hugging Face ``Gemma3TextModel``: embeddings times ``sqrt(hidden)`` (rounded to
the weights' dtype, as transformers does), then layers of "sandwich" RMSNorms (Gemma's:
gain ``1 + w``, applied in fp32) around grouped-query attention with per-head q/k norms and
rotary positions, and around a GeGLU MLP (``gelu_pytorch_tanh``), then a final norm. Scores
are scaled by ``query_pre_attn_scalar ** -0.5`` (the backends scale by ``head_dim ** -0.5``,
so q is pre-multiplied where the two differ). Layers alternate sliding-window (local RoPE
theta, 10k) and full attention (1M) per ``layer_types`` (or every 6th layer full in older
configs). The window, as transformers builds it: bidirectional, keys at most
``sliding_window // 2`` positions away (the config's in-memory value is ``saved // 2 + 1``,
an exclusive bound); causal, the ``sliding_window`` most recent keys.

On CUDA the window decides per batch (``mask_free_length``: the window plus one, 257 tokens
for EmbeddingGemma's saved 512, bidirectional; ``sliding_window`` causal). A batch whose
every sequence is that short (a batch of queries, say; a 16k-token batch of corpus passages
nearly always holds a longer one) takes the fast path,
FlashInfer (varlen for head_dim 256) attention and the CUDA graphs per token bucket, the
window dropped; a batch holding a longer one runs eagerly with the window as a mask on
FlashInfer (``flashinfer_windowed.py``, head_dim 256 included; ``gpu.GpuRunner``). Eager
torch for the rest.
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
    rms_norm_unit_offset,
)
from mesh.worker.engine.weights import Weights

THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}

norm = rms_norm_unit_offset


class Gemma3Layer(nn.Module):
    def __init__(
        self,
        w: Weights,
        dims: tuple[int, int, int],
        eps: float,
        window: int | None,
        act: Activation,
        q_scale: float,
    ) -> None:
        super().__init__()
        self.dims, self.eps, self.window, self.act, self.q_scale = dims, eps, window, act, q_scale
        proj = [f"self_attn.{p}_proj" for p in ("q", "k", "v")]
        self.register_buffer("qkv_w", w.cat([f"{p}.weight" for p in proj]))
        has_bias = f"{proj[0]}.bias" in w
        self.register_buffer("qkv_b", w.cat([f"{p}.bias" for p in proj]) if has_bias else None)
        self.register_buffer("o_w", w("self_attn.o_proj.weight"))
        self.register_buffer("o_b", w.optional("self_attn.o_proj.bias"))
        self.register_buffer("gate_up_w", w.cat([f"mlp.{p}_proj.weight" for p in ("gate", "up")]))
        self.register_buffer("down_w", w("mlp.down_proj.weight"))
        for name in ("self_attn.q_norm", "self_attn.k_norm", "input_layernorm"):
            self.register_buffer(name.rsplit(".", 1)[-1], w(f"{name}.weight"))
        for name in ("post_attention", "pre_feedforward", "post_feedforward"):
            self.register_buffer(name, w(f"{name}_layernorm.weight"))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        hq, hkv, d = self.dims
        h = norm(x, self.input_layernorm, self.eps)
        q, k, v = F.linear(h, self.qkv_w, self.qkv_b).split([hq * d, hkv * d, hkv * d], dim=-1)
        q = norm(q.reshape(-1, hq, d), self.q_norm, self.eps)
        k = norm(k.reshape(-1, hkv, d), self.k_norm, self.eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        a = attn.run(q, k, v.reshape(-1, hkv, d), window=self.window)
        a = F.linear(a.reshape(x.shape[0], -1), self.o_w, self.o_b)
        x = x + norm(a, self.post_attention, self.eps)
        m = gated_mlp(
            norm(x, self.pre_feedforward, self.eps), self.gate_up_w, self.down_w, self.act
        )
        return x + norm(m, self.post_feedforward, self.eps)


class Gemma3Embedder(PackedEncoder):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    family = "gemma3"
    eps_key = ("rms_norm_eps", 1e-6)
    eager_only = True

    def build(self, config: dict[str, Any], w: Weights) -> None:
        act = activation(str(config.get("hidden_activation", "gelu_pytorch_tanh")), self.family)
        self.layer_types = _layer_types(config)
        window = _window(config, self.causal)
        # The local layers' window binds only on longer sequences (GpuRunner's choice).
        self.windows = tuple(window if k == "sliding_attention" else None for k in self.layer_types)
        self.rope = RopeTables(config, self.layer_types, _rope_theta, self.head_dim, w.device)
        # The backends scale by head_dim ** -0.5; Gemma by query_pre_attn_scalar ** -0.5.
        scalar = float(config.get("query_pre_attn_scalar", self.head_dim))
        q_scale = (self.head_dim / scalar) ** 0.5
        # transformers multiplies by the scale as a tensor in the weights' dtype.
        self.embed_scale = float(torch.tensor(self.hidden**0.5, dtype=self.dtype))
        self.register_buffer("embed", w("embed_tokens.weight"))
        self.layers = nn.ModuleList(
            Gemma3Layer(w.under(f"layers.{i}."), self.heads, self.eps, window, act, q_scale)
            for i, window in enumerate(self.windows)
        )
        self.register_buffer("norm", w("norm.weight"))

    @classmethod
    def check_supported(cls, config: dict[str, Any]) -> None:
        if config.get("attn_logit_softcapping") is not None:
            raise NotImplementedError("gemma3: attn_logit_softcapping is not supported")

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.embed[ids] * self.embed_scale
        rope = self.rope(positions, x.dtype)
        for layer, kind in zip(self.layers, self.layer_types, strict=True):
            x = layer(x, *rope[kind], attn)
        return norm(x, self.norm, self.eps)


def _layer_types(config: dict[str, Any]) -> list[str]:
    n = int(config["num_hidden_layers"])
    pattern = int(config.get("sliding_window_pattern", 6))
    kinds = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)
    ]
    if set(kinds) - set(THETA) or len(kinds) != n:
        raise NotImplementedError(f"gemma3: layer_types {kinds!r} are not supported")
    return list(kinds)


def _window(config: dict[str, Any], causal: bool) -> int | None:
    """The local layers' window as a backend's ``run`` takes it: keys at most this far
    away."""
    saved = config.get("sliding_window")
    if saved is None:
        return None
    return int(saved) - 1 if causal else int(saved) // 2


def _rope_theta(config: dict[str, Any], kind: str) -> float:
    # transformers >= 5 writes rope_parameters per layer type; older configs have rope_theta
    # (global), rope_local_base_freq (local) and rope_scaling (global layers only).
    params = dict((config.get("rope_parameters") or {}).get(kind) or {})
    if kind == "full_attention":
        params.update(config.get("rope_scaling") or {})
    check_default_rope(params, "gemma3")
    old = config.get("rope_theta" if kind == "full_attention" else "rope_local_base_freq")
    return float(params.get("rope_theta", old or THETA[kind]))

"""Decoders used as embedders (Qwen3, Qwen2, Mistral) over packed batches.

Same math as Hugging Face ``Qwen3Model`` / ``Qwen2Model`` / ``MistralModel``: token
embeddings, then pre-norm layers of grouped-query self-attention with rotary positions and
a SwiGLU MLP, then a final RMSNorm. Qwen3 adds an RMSNorm per head on q and k before RoPE
(``q_norm`` / ``k_norm``); Qwen2 has q/k/v biases. Positions restart at 0 for every packed
sequence. Query/key/value are fused into one projection and gate/up into another at load.

Two attention modes, chosen by :func:`mesh.worker.engine.card.is_causal` and stored in the
card:

- causal (Qwen3-Embedding, gte-Qwen2, e5-mistral): each token sees itself and earlier
  tokens; pooled from the last token (``1_Pooling`` ``pooling_mode_lasttoken``).
- bidirectional (pplx-embed style): every token sees its whole sequence; mean pooled. Chosen
  when ``config.json`` says ``is_causal: false`` or ``use_bidirectional_attention: true``,
  or, with neither flag, when the sentence-transformers pooling is mean.

Three ways to run the non-GEMM parts, picked per model by :meth:`DecoderEmbedder.use_kernels`:
eager torch (the CPU path and the reference), ``torch.compile`` of the per-layer functions,
or the fused CUDA path (:mod:`mesh.worker.engine.kernels.fused`), where each residual add is fused
into the norm that follows it, so layers hand back their MLP output and the model loop adds
it to the residual stream together with the next layer's input norm (or the final norm).
Without q/k norms (Qwen2, Mistral) the fused path applies RoPE in torch.

Sliding-window attention is not implemented: Qwen2/Qwen3 with ``use_sliding_window`` are
refused; Mistral's window (on by default) is kept from binding by the card, which caps an
input at ``sliding_window`` tokens (:func:`mesh.worker.engine.card.read_card`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine.kernels import fused
from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.blocks import (
    activation,
    apply_rope,
    check_default_rope,
    rms_norm,
    rope_cos_sin,
    rope_inv_freq,
    rope_parameters,
    split_qkv,
)
from mesh.worker.engine.weights import Weights

# (before_attention, after_attention): plain or compiled, as the layers call them.
LayerFns = tuple[Callable[..., Any], Callable[..., torch.Tensor]]


class DecoderLayer(nn.Module):
    def __init__(self, w: Weights, dims: tuple[int, int, int], eps: float, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = dims
        self.eps = eps
        proj = [f"self_attn.{p}_proj" for p in ("q", "k", "v")]
        self.register_buffer("qkv_w", w.cat([f"{p}.weight" for p in proj]))
        has_bias = f"{proj[0]}.bias" in w
        self.register_buffer("qkv_b", w.cat([f"{p}.bias" for p in proj]) if has_bias else None)
        self.register_buffer("o_w", w("self_attn.o_proj.weight"))
        # Qwen3 with attention_bias has one here too; Qwen2 biases q/k/v only.
        self.register_buffer("o_b", w.optional("self_attn.o_proj.bias"))
        self.register_buffer("q_norm", w("self_attn.q_norm.weight") if qk_norm else None)
        self.register_buffer("k_norm", w("self_attn.k_norm.weight") if qk_norm else None)
        self.register_buffer("in_norm", w("input_layernorm.weight"))
        self.register_buffer("post_norm", w("post_attention_layernorm.weight"))
        self.register_buffer("gate_up_w", w.cat([f"mlp.{p}_proj.weight" for p in ("gate", "up")]))
        self.register_buffer("down_w", w("mlp.down_proj.weight"))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
        fns: LayerFns,
    ) -> torch.Tensor:
        """Plain or compiled path: ``x`` in, the next residual stream out; ``cos``, ``sin``
        ``[T, 1, D]``."""
        dims = (self.num_heads, self.num_kv_heads, self.head_dim)
        norms = (self.in_norm, self.q_norm, self.k_norm)
        before, after = fns
        q, k, v = before(x, norms, self.qkv_w, self.qkv_b, cos, sin, dims, self.eps)
        a = attn.run(q, k, v)
        return after(
            x, a, self.o_w, self.o_b, self.post_norm, self.gate_up_w, self.down_w, self.eps
        )

    def forward_fused(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> torch.Tensor:
        """Fused path: ``h`` is this layer's normed input, ``x`` the residual stream, which
        this updates in place with the attention output. Returns the MLP output, for the
        caller to add fused with the next norm. ``cos``, ``sin`` ``[T, D]``."""
        qkv = F.linear(h, self.qkv_w, self.qkv_b)
        dims = (self.num_heads, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k, v = fused.qk_norm_rope_(qkv, self.q_norm, self.k_norm, cos, sin, *dims, self.eps)
        else:
            q, k, v = split_qkv(qkv, dims)
            q, k = (
                apply_rope(q, cos[:, None], sin[:, None]),
                apply_rope(k, cos[:, None], sin[:, None]),
            )
        a = attn.run(q, k, v).reshape(x.shape[0], -1)
        h = fused.add_rms_norm(x, F.linear(a, self.o_w, self.o_b), self.post_norm, self.eps)
        return F.linear(fused.silu_mul(F.linear(h, self.gate_up_w)), self.down_w)


def before_attention(
    x: torch.Tensor,
    norms: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    qkv_w: torch.Tensor,
    qkv_b: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dims: tuple[int, int, int],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, fused QKV projection, q/k RMSNorm per head (Qwen3), rotary embedding."""
    in_norm, q_norm, k_norm = norms
    hq, hkv, d = dims
    total = x.shape[0]
    h = rms_norm(x, in_norm, eps)
    q, k, v = F.linear(h, qkv_w, qkv_b).split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.reshape(total, hq, d), k.reshape(total, hkv, d)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.reshape(total, hkv, d)


def after_attention(
    x: torch.Tensor,
    a: torch.Tensor,
    o_w: torch.Tensor,
    o_b: torch.Tensor | None,
    post_norm: torch.Tensor,
    gate_up_w: torch.Tensor,
    down_w: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Output projection, residual, RMSNorm, SwiGLU MLP, residual."""
    x = x + F.linear(a.reshape(x.shape[0], -1), o_w, o_b)
    h = rms_norm(x, post_norm, eps)
    gate, up = F.linear(h, gate_up_w).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_w)


@functools.cache
def _compiled_fns() -> LayerFns:
    # One compile of each plain function serves every layer of every model in the process
    # (measured: Qwen3's non-GEMM time 32 -> 6.5 ms a 16k-token batch with shapes
    # fixed; dynamic shapes, as here, reached 17 ms on the H200).
    return (
        torch.compile(before_attention, dynamic=True),
        torch.compile(after_attention, dynamic=True),
    )


class DecoderEmbedder(PackedEncoder):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    family = "qwen3"
    eps_key = ("rms_norm_eps", 1e-6)
    qk_norm = True  # Qwen3's per-head q/k RMSNorm

    def build(self, config: dict[str, Any], w: Weights) -> None:
        theta = float(rope_parameters(config).get("rope_theta", 10000.0))
        self.register_buffer("inv_freq", rope_inv_freq(self.head_dim, theta, w.device))
        self.register_buffer("embed", w("embed_tokens.weight"))
        self.layers = nn.ModuleList(
            DecoderLayer(w.under(f"layers.{i}."), self.heads, self.eps, self.qk_norm)
            for i in range(self.shape.num_layers)
        )
        self.register_buffer("norm", w("norm.weight"))
        self._fns: LayerFns = (before_attention, after_attention)

    @classmethod
    def check_supported(cls, config: dict[str, Any]) -> None:
        check_default_rope(rope_parameters(config), cls.family)
        sliding = "sliding_attention" in (config.get("layer_types") or ())
        if config.get("use_sliding_window") or (sliding and cls.family != "mistral"):
            raise NotImplementedError(f"{cls.family}: sliding-window attention is not supported")
        act = config.get("hidden_act", "silu")
        if activation(act, cls.family) is not F.silu:
            raise NotImplementedError(f"{cls.family}: hidden_act {act!r} is not supported (silu)")

    def select_kernels(self, kernels: str, exact_gelu: bool) -> str:
        """Run the layers through "torch", "compile" or "fused" (Triton kernels; CUDA, or
        Triton's interpreter in tests). ``exact_gelu`` is BERT's; there is no GELU here."""
        self._fns = _compiled_fns() if kernels == "compile" else (before_attention, after_attention)
        return kernels

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.embed[ids]
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)  # [T, D]
        if self.kernels == "fused":
            return self._forward_fused(x, cos, sin, attn)
        for layer in self.layers:  # [T, 1, D] cos/sin: broadcast over heads
            x = layer(x, cos[:, None], sin[:, None], attn, self._fns)
        return rms_norm(x, self.norm, self.eps)

    def _forward_fused(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        # x (a fresh gather of the embeddings) is the residual stream, updated in place.
        after = [layer.in_norm for layer in self.layers[1:]] + [self.norm]
        h = fused.add_rms_norm(x, None, self.layers[0].in_norm, self.eps)
        for layer, next_norm in zip(self.layers, after, strict=True):
            delta = layer.forward_fused(x, h, cos, sin, attn)
            h = fused.add_rms_norm(x, delta, next_norm, self.eps)
        return h


class Qwen3Embedder(DecoderEmbedder):
    family = "qwen3"
    qk_norm = True


class Qwen2Embedder(DecoderEmbedder):
    """Qwen2 (gte-Qwen2, stella): q/k/v biases, no q/k norm."""

    family = "qwen2"
    qk_norm = False


class MistralEmbedder(DecoderEmbedder):
    """Mistral (e5-mistral, SFR-Embedding-Mistral): no biases, no q/k norm; every layer's
    sliding window (which ``MistralModel`` applies whatever ``layer_types`` says) never
    binds, because the card caps an input at its width."""

    family = "mistral"
    qk_norm = False

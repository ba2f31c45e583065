"""Qwen3-family decoder used as an embedder, over packed batches.

Same math as Hugging Face ``Qwen3Model``: token embeddings, then pre-norm layers of
grouped-query self-attention (RMSNorm per head on q and k before RoPE, ``q_norm`` /
``k_norm``) and a SwiGLU MLP, then a final RMSNorm. Positions restart at 0 for every packed
sequence. Query/key/value are fused into one projection and gate/up into another at load.

Two attention modes, chosen by :func:`mesh.worker.engine.card.is_causal` and stored in the
card:

- causal (Qwen3-Embedding): each token sees itself and earlier tokens; pooled from the last
  token (``1_Pooling`` ``pooling_mode_lasttoken``).
- bidirectional (pplx-embed style): every token sees its whole sequence; mean pooled. Chosen
  when ``config.json`` says ``is_causal: false`` or ``use_bidirectional_attention: true``,
  or, with neither flag, when the sentence-transformers pooling is mean.

Three ways to run the non-GEMM parts, picked per model by :meth:`Qwen3Embedder.use_kernels`:
eager torch (the CPU path and the reference), ``torch.compile`` of the per-layer functions,
or the fused CUDA path (:mod:`mesh.worker.engine.fused`), where each residual add is fused
into the norm that follows it, so layers hand back their MLP output and the model loop adds
it to the residual stream together with the next layer's input norm (or the final norm).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine import fused
from mesh.worker.engine.attention import AttentionBackend
from mesh.worker.engine.loader import WeightSource

# (before_attention, after_attention): plain or compiled, as the layers call them.
LayerFns = tuple[Callable[..., Any], Callable[..., torch.Tensor]]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # In fp32 and cast back before the weight, exactly as HF Qwen3RMSNorm, so that bf16
    # results match the reference bit for bit where possible.
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3Layer(nn.Module):
    def __init__(
        self,
        source: WeightSource,
        prefix: str,
        dims: tuple[int, int, int],
        eps: float,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = dims
        self.eps = eps

        def take(name: str) -> torch.Tensor:
            return source.get(prefix + name, dtype, device)

        proj = [f"{prefix}self_attn.{p}_proj" for p in ("q", "k", "v")]
        self.register_buffer("qkv_w", source.cat([f"{p}.weight" for p in proj], dtype, device))
        has_bias = f"{proj[0]}.bias" in source
        qkv_b = source.cat([f"{p}.bias" for p in proj], dtype, device) if has_bias else None
        self.register_buffer("qkv_b", qkv_b)
        self.register_buffer("o_w", take("self_attn.o_proj.weight"))
        self.register_buffer("o_b", take("self_attn.o_proj.bias") if has_bias else None)
        self.register_buffer("q_norm", take("self_attn.q_norm.weight"))
        self.register_buffer("k_norm", take("self_attn.k_norm.weight"))
        self.register_buffer("in_norm", take("input_layernorm.weight"))
        self.register_buffer("post_norm", take("post_attention_layernorm.weight"))
        mlp = [f"{prefix}mlp.{p}_proj.weight" for p in ("gate", "up")]
        self.register_buffer("gate_up_w", source.cat(mlp, dtype, device))
        self.register_buffer("down_w", take("mlp.down_proj.weight"))

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
        q, k, v = fused.qk_norm_rope_(qkv, self.q_norm, self.k_norm, cos, sin, *dims, self.eps)
        a = attn.run(q, k, v).reshape(x.shape[0], -1)
        h = fused.add_rms_norm(x, F.linear(a, self.o_w, self.o_b), self.post_norm, self.eps)
        return F.linear(fused.silu_mul(F.linear(h, self.gate_up_w)), self.down_w)


def before_attention(
    x: torch.Tensor,
    norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    qkv_w: torch.Tensor,
    qkv_b: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dims: tuple[int, int, int],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, fused QKV projection, q/k RMSNorm per head, rotary embedding.

    Plain functions of tensors (no module state), so that one ``torch.compile`` serves every
    layer: compiling a bound method would guard on ``self`` and recompile per layer.
    """
    in_norm, q_norm, k_norm = norms
    hq, hkv, d = dims
    total = x.shape[0]
    h = rms_norm(x, in_norm, eps)
    q, k, v = F.linear(h, qkv_w, qkv_b).split([hq * d, hkv * d, hkv * d], dim=-1)
    q = rms_norm(q.reshape(total, hq, d), q_norm, eps)
    k = rms_norm(k.reshape(total, hkv, d), k_norm, eps)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return q, k, v.reshape(total, hkv, d)


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
    # (NOTES.md measured Qwen3's non-GEMM time 32 -> 6.5 ms a 16k-token batch with shapes
    # fixed; dynamic shapes, as here, reached 17 ms on the H200).
    return (
        torch.compile(before_attention, dynamic=True),
        torch.compile(after_attention, dynamic=True),
    )


class Qwen3Embedder(nn.Module):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    def __init__(
        self,
        config: dict[str, Any],
        source: WeightSource,
        dtype: torch.dtype,
        device: torch.device | str,
        causal: bool,
    ) -> None:
        super().__init__()
        _check_supported(config)
        self.causal = causal
        self.dtype = dtype
        self.hidden = int(config["hidden_size"])
        self.vocab_size = int(config["vocab_size"])
        num_heads = int(config["num_attention_heads"])
        num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
        head_dim = int(config.get("head_dim") or self.hidden // num_heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        theta = float(_rope_parameters(config).get("rope_theta", 10000.0))
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq.to(device))
        self.register_buffer("embed", source.get("embed_tokens.weight", dtype, device))
        self.layers = nn.ModuleList(
            Qwen3Layer(
                source, f"layers.{i}.", (num_heads, num_kv_heads, head_dim), self.eps, dtype, device
            )
            for i in range(int(config["num_hidden_layers"]))
        )
        self.register_buffer("norm", source.get("norm.weight", dtype, device))
        self.kernels = "torch"
        self._fns: LayerFns = (before_attention, after_attention)

    def use_kernels(self, kernels: str) -> None:
        """Run the layers through "torch", "compile" or "fused" (Triton kernels; CUDA, or
        Triton's interpreter in tests)."""
        if kernels not in ("torch", "compile", "fused"):
            raise ValueError(f"unknown kernels {kernels!r}")
        self._fns = _compiled_fns() if kernels == "compile" else (before_attention, after_attention)
        self.kernels = kernels

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.embed[ids]
        # Angles in fp32 (as HF), then cast: positions up to 32k lose precision in bf16.
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
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


def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    # transformers >= 5 writes "rope_parameters"; Qwen3 checkpoints on the Hub have a
    # top-level "rope_theta" and "rope_scaling": null.
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "rope_theta" in config:
        params.setdefault("rope_theta", config["rope_theta"])
    return params


def _check_supported(config: dict[str, Any]) -> None:
    params = _rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported")
    if config.get("use_sliding_window"):
        raise NotImplementedError("sliding-window attention is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {config.get('hidden_act')!r} is not supported")

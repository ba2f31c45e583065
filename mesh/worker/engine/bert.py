"""BERT-family encoder (MiniLM, BGE, E5, GTE) over packed batches.

Same math as Hugging Face ``BertModel`` in eval mode with absolute position embeddings and
token type 0: embeddings LayerNorm, then post-LN layers of bidirectional self-attention and
an exact-erf GELU MLP. Differences are of layout only: no padding (``[T, hidden]`` and
``cu_seqlens``), query/key/value fused into one projection at load so that each layer does
one GEMM instead of three.

The per-layer work after attention is one plain function of tensors, picked per model by
:meth:`BertEncoder.use_kernels`: eager torch (the CPU path and the reference), one
``torch.compile`` of it, or the fused CUDA path (:mod:`mesh.worker.engine.fused` residual +
LayerNorm kernels, bias + GELU in the up projection's cuBLASLt epilogue).
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

AfterAttention = Callable[..., torch.Tensor]


class BertLayer(nn.Module):
    def __init__(
        self,
        source: WeightSource,
        prefix: str,
        num_heads: int,
        eps: float,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.eps = eps

        def take(name: str) -> torch.Tensor:
            return source.get(prefix + name, dtype, device)

        qkv = [f"{prefix}attention.self.{p}" for p in ("query", "key", "value")]
        self.register_buffer("qkv_w", source.cat([f"{p}.weight" for p in qkv], dtype, device))
        self.register_buffer("qkv_b", source.cat([f"{p}.bias" for p in qkv], dtype, device))
        self.register_buffer("out_w", take("attention.output.dense.weight"))
        self.register_buffer("out_b", take("attention.output.dense.bias"))
        self.register_buffer("ln1_w", take("attention.output.LayerNorm.weight"))
        self.register_buffer("ln1_b", take("attention.output.LayerNorm.bias"))
        self.register_buffer("up_w", take("intermediate.dense.weight"))
        self.register_buffer("up_b", take("intermediate.dense.bias"))
        self.register_buffer("down_w", take("output.dense.weight"))
        self.register_buffer("down_b", take("output.dense.bias"))
        self.register_buffer("ln2_w", take("output.LayerNorm.weight"))
        self.register_buffer("ln2_b", take("output.LayerNorm.bias"))

    def forward(
        self, x: torch.Tensor, attn: AttentionBackend, after: AfterAttention
    ) -> torch.Tensor:
        total = x.shape[0]
        qkv = F.linear(x, self.qkv_w, self.qkv_b).view(total, 3, self.num_heads, -1)
        a = attn.run(qkv[:, 0], qkv[:, 1], qkv[:, 2])
        return after(
            x,
            a.reshape(x.shape),
            (self.out_w, self.out_b, self.ln1_w, self.ln1_b),
            (self.up_w, self.up_b, self.down_w, self.down_b, self.ln2_w, self.ln2_b),
            self.eps,
        )


def after_attention(
    x: torch.Tensor,
    a: torch.Tensor,
    attn_out: tuple[torch.Tensor, ...],
    mlp: tuple[torch.Tensor, ...],
    eps: float,
) -> torch.Tensor:
    """Output projection, residual, LayerNorm, GELU MLP, residual, LayerNorm.

    A plain function of tensors (no module state) so that one ``torch.compile`` of it serves
    every layer: compiling a bound method would guard on ``self`` and recompile per layer.
    """
    out_w, out_b, ln1_w, ln1_b = attn_out
    up_w, up_b, down_w, down_b, ln2_w, ln2_b = mlp
    hidden = (x.shape[-1],)
    x = F.layer_norm(x + F.linear(a, out_w, out_b), hidden, ln1_w, ln1_b, eps)
    h = F.gelu(F.linear(x, up_w, up_b))  # exact erf GELU, as BERT's "gelu"
    return F.layer_norm(x + F.linear(h, down_w, down_b), hidden, ln2_w, ln2_b, eps)


def after_attention_fused(
    x: torch.Tensor,
    a: torch.Tensor,
    attn_out: tuple[torch.Tensor, ...],
    mlp: tuple[torch.Tensor, ...],
    eps: float,
    exact_gelu: bool = False,
) -> torch.Tensor:
    """:func:`after_attention` with each residual add fused into its LayerNorm (Triton) and
    the GELU into the up projection (:func:`up_gelu`). CUDA only, capturable in a graph."""
    out_w, out_b, ln1_w, ln1_b = attn_out
    up_w, up_b, down_w, down_b, ln2_w, ln2_b = mlp
    x = fused.add_layer_norm(x, F.linear(a, out_w, out_b), ln1_w, ln1_b, eps)
    h = up_gelu(x, up_w, up_b, exact_gelu)
    return fused.add_layer_norm(x, F.linear(h, down_w, down_b), ln2_w, ln2_b, eps)


def up_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, exact: bool) -> torch.Tensor:
    """``gelu(x @ w.T + b)``; on CUDA without ``exact``, GELU's tanh approximation fused into
    the GEMM's cuBLASLt epilogue (``torch._addmm_activation``), which saves the eager GELU
    kernel (0.80 of 7.69 ms a 16k-token BERT-base batch on the H200).

    HF BERT's "gelu" is the exact erf form; the tanh form differs from it by at most 4.7e-4
    (at |x| = 2.70, where a bf16 ulp is 1.6e-2). Text-embeddings-inference makes the same
    trade: its candle backend maps ``hidden_act: "gelu"`` to the tanh GELU and runs it as a
    cuBLASLt epilogue (huggingface/text-embeddings-inference @0d124dc,
    backends/candle/src/layers/linear.rs: "`GeluErf` is excluded due to incompatibility with
    cuBLASLt ... GeLU is standardized to tanh approx."; lib.rs logs a warning saying so;
    PR #753). Where torch's cuBLASLt path does not apply (it has shape and layout
    conditions) torch runs the GEMM then a tanh GELU: the same math, unfused. On CPU
    ``_addmm_activation`` uses erf, so CPU takes the eager path and stays exact.
    """
    if exact or not x.is_cuda:
        return F.gelu(F.linear(x, w, b))
    return torch._addmm_activation(b, x, w.t(), use_gelu=True)


@functools.cache
def _compiled_after_attention() -> AfterAttention:
    # One compile serves every layer of every model in the process (a plain function: a
    # bound method would guard on self and recompile per layer).
    return torch.compile(after_attention, dynamic=True)


def after_attention_for(kernels: str, exact_gelu: bool = False) -> AfterAttention:
    """The per-layer function for ``kernels`` ("torch", "compile" or "fused")."""
    if kernels == "torch":
        return after_attention
    if kernels == "compile":
        return _compiled_after_attention()
    if kernels == "fused":
        return functools.partial(after_attention_fused, exact_gelu=exact_gelu)
    raise ValueError(f"unknown kernels {kernels!r}")


class BertEncoder(nn.Module):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    causal = False

    def __init__(
        self,
        config: dict[str, Any],
        source: WeightSource,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        _check_supported(config)
        self.dtype = dtype
        self.hidden = int(config["hidden_size"])
        self.num_heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.num_heads
        self.vocab_size = int(config["vocab_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))

        def take(name: str) -> torch.Tensor:
            return source.get(name, dtype, device)

        self.register_buffer("word", take("embeddings.word_embeddings.weight"))
        self.register_buffer("pos", take("embeddings.position_embeddings.weight"))
        # Token type is always 0 for single-text embedding: fold its row in once.
        self.register_buffer("type0", take("embeddings.token_type_embeddings.weight")[0])
        self.register_buffer("ln_w", take("embeddings.LayerNorm.weight"))
        self.register_buffer("ln_b", take("embeddings.LayerNorm.bias"))
        self.layers = nn.ModuleList(
            BertLayer(source, f"encoder.layer.{i}.", self.num_heads, self.eps, dtype, device)
            for i in range(int(config["num_hidden_layers"]))
        )
        self.kernels = "torch"
        self._after: AfterAttention = after_attention

    def use_kernels(self, kernels: str, exact_gelu: bool = False) -> None:
        """Run the layers through "torch", "compile" or "fused" (CUDA; see
        :func:`after_attention_fused`; ``exact_gelu`` keeps the eager erf GELU there)."""
        self._after = after_attention_for(kernels, exact_gelu)
        self.kernels = kernels

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.word[ids] + self.pos[positions] + self.type0
        x = F.layer_norm(x, (self.hidden,), self.ln_w, self.ln_b, self.eps)
        for layer in self.layers:
            x = layer(x, attn, self._after)
        return x


def _check_supported(config: dict[str, Any]) -> None:
    # Refuse variants whose math we do not implement rather than serve wrong vectors.
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise NotImplementedError("only absolute position embeddings are supported")
    if config.get("hidden_act", "gelu") != "gelu":
        raise NotImplementedError(f"hidden_act {config.get('hidden_act')!r} is not supported")

"""The layers families share, written once: norms, activations, rotary positions, the MLP
variants, fused QKV splitting, rotary tables per layer kind, and the post-LN layer wiring.

Everything here is a plain function of tensors (weights are arguments, not module state),
so that one ``torch.compile`` of a function serves every layer of every model: compiling
a bound method would guard on ``self`` and recompile per layer. Each family file
(:mod:`.bert`, :mod:`.decoder`, ...) reads its config and weights and wires these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine.kernels import fused

Activation = Callable[[torch.Tensor], torch.Tensor]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Hugging Face ``hidden_act`` names served, each the same function as transformers' ACT2FN
# entry ("gelu_new" is the tanh formula that F.gelu's tanh form computes).
ACTIVATIONS: dict[str, Activation] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
}


# The activations fused.glu runs after a gated projection, by its name for them; a GLU with
# another activation (relu) runs it in torch on the fused path.
FUSED_GLU: dict[Activation, str] = {F.silu: "silu", F.gelu: "gelu", _gelu_tanh: "gelu_tanh"}


def activation(name: str, family: str) -> Activation:
    """The activation called ``name``; NotImplementedError naming it and those served."""
    act = ACTIVATIONS.get(name)
    if act is None:
        served = ", ".join(ACTIVATIONS)
        raise NotImplementedError(f"{family}: hidden_act {name!r} is not supported ({served})")
    return act


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # In fp32 and cast back before the weight, exactly as HF Qwen3RMSNorm / LlamaRMSNorm, so
    # that bf16 results match the reference bit for bit where possible.
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rms_norm_unit_offset(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: the gain is ``1 + weight``, applied in fp32 before the cast back."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    # transformers >= 5 writes "rope_parameters"; checkpoints on the Hub have a top-level
    # "rope_theta" and "rope_scaling": null.
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "rope_theta" in config:
        params.setdefault("rope_theta", config["rope_theta"])
    return params


def check_default_rope(params: dict[str, Any], family: str) -> None:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"{family}: rope_type {rope_type!r} is not supported")


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """Inverse frequencies of the default rotary embedding, fp32 ``[head_dim / 2]``."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    return (1.0 / theta**exps).to(device)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [T, D]`` for each token's position, halves repeated (HF's layout)."""
    # Angles in fp32 (as HF), then cast: positions up to 32k lose precision in bf16.
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class RopeTables(nn.Module):
    """Rotary tables per layer kind (ModernBERT's and Gemma 3's global and local layers
    have a theta each): ``forward(positions, dtype)`` gives each kind's ``cos, sin [T, 1,
    D]`` (broadcast over heads), computed once a batch for all the layers of that kind."""

    def __init__(
        self,
        config: dict[str, Any],
        kinds: list[str],
        theta: Callable[[dict[str, Any], str], float],
        head_dim: int,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.kinds = sorted(set(kinds))
        for kind in self.kinds:
            inv_freq = rope_inv_freq(head_dim, theta(config, kind), device)
            self.register_buffer(f"inv_freq_{kind}", inv_freq)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        tables = {}
        for kind in self.kinds:
            cos, sin = rope_cos_sin(positions, self.get_buffer(f"inv_freq_{kind}"), dtype)
            tables[kind] = (cos[:, None], sin[:, None])
        return tables


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [T, H, D]`` rotated; ``cos``, ``sin`` ``[T, 1, D]`` (broadcast over heads)."""
    return x * cos + rotate_half(x) * sin


def split_qkv(
    qkv: torch.Tensor, dims: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused projection's ``[T, (hq + 2 hkv) d]`` output as views ``q [T, hq, d]``,
    ``k, v [T, hkv, d]`` (strided: every attention backend takes strides)."""
    hq, hkv, d = dims
    q, k, v = qkv.view(qkv.shape[0], hq + 2 * hkv, d).split([hq, hkv, hkv], dim=1)
    return q, k, v


def gated_mlp(
    x: torch.Tensor,
    gate_up_w: torch.Tensor,
    down_w: torch.Tensor,
    act: Activation,
    gate_up_b: torch.Tensor | None = None,
    down_b: torch.Tensor | None = None,
) -> torch.Tensor:
    """GLU MLP: ``down(act(first half) * second half)`` of the fused ``gate_up``
    projection: SwiGLU with silu, GeGLU with gelu."""
    gate, up = F.linear(x, gate_up_w, gate_up_b).chunk(2, dim=-1)
    return F.linear(act(gate) * up, down_w, down_b)


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


# Post-LN wiring (BERT, XLM-RoBERTa, MPNet): the layer after its attention. A plain function
# per way to run it, picked by post_ln_for().
PostLn = Callable[..., torch.Tensor]


def post_ln(
    x: torch.Tensor,
    a: torch.Tensor,
    attn_out: tuple[torch.Tensor, ...],
    mlp: tuple[torch.Tensor, ...],
    eps: float,
) -> torch.Tensor:
    """Output projection, residual, LayerNorm, GELU MLP, residual, LayerNorm."""
    out_w, out_b, ln1_w, ln1_b = attn_out
    up_w, up_b, down_w, down_b, ln2_w, ln2_b = mlp
    hidden = (x.shape[-1],)
    x = F.layer_norm(x + F.linear(a, out_w, out_b), hidden, ln1_w, ln1_b, eps)
    h = F.gelu(F.linear(x, up_w, up_b))  # exact erf GELU, as BERT's "gelu"
    return F.layer_norm(x + F.linear(h, down_w, down_b), hidden, ln2_w, ln2_b, eps)


def post_ln_fused(
    x: torch.Tensor,
    a: torch.Tensor,
    attn_out: tuple[torch.Tensor, ...],
    mlp: tuple[torch.Tensor, ...],
    eps: float,
    exact_gelu: bool = False,
) -> torch.Tensor:
    """:func:`post_ln` with each residual add fused into its LayerNorm (Triton) and the
    GELU into the up projection (:func:`up_gelu`). CUDA only, capturable in a graph."""
    out_w, out_b, ln1_w, ln1_b = attn_out
    up_w, up_b, down_w, down_b, ln2_w, ln2_b = mlp
    x = fused.add_layer_norm(x, F.linear(a, out_w, out_b), ln1_w, ln1_b, eps)
    h = up_gelu(x, up_w, up_b, exact_gelu)
    return fused.add_layer_norm(x, F.linear(h, down_w, down_b), ln2_w, ln2_b, eps)


@functools.cache
def _compiled_post_ln() -> PostLn:
    # One compile serves every layer of every model in the process.
    return torch.compile(post_ln, dynamic=True)


def post_ln_for(kernels: str, exact_gelu: bool = False) -> PostLn:
    """The post-LN function for ``kernels`` ("torch", "compile" or "fused")."""
    if kernels == "torch":
        return post_ln
    if kernels == "compile":
        return _compiled_post_ln()
    if kernels == "fused":
        return functools.partial(post_ln_fused, exact_gelu=exact_gelu)
    raise ValueError(f"unknown kernels {kernels!r}")

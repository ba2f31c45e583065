"""NomicBERT (nomic-embed-text) and the new GTE (gte-*-v1.5, gte-multilingual) over packed
batches: post-LN encoders with rotary positions and a gated MLP.

Same math as Hugging Face ``NomicBertModel`` and ``GteModel``: word embeddings (plus token
type 0 where the model has types) and a LayerNorm, then layers of bidirectional attention
with RoPE, residual + LayerNorm, a GLU MLP (``down(act(gate) * up)``: SwiGLU for Nomic,
GeGLU for GTE), residual + LayerNorm. GTE has q/k/v/o and down biases, Nomic none: biases are
taken where the checkpoint has them.

Three weight layouts load: transformers' own (``layers.N.self_attn.q_proj`` ...), and the
remote-code checkpoints on the Hub, which transformers converts on load (its
``conversion_mapping``) and writes back on save: Nomic's (``encoder.layers.N.attn.Wqkv``, ``mlp.fc11`` = up,
``mlp.fc12`` = gate, ``norm1``/``norm2``, ``emb_ln``) and GTE's ``NewModel``
(``encoder.layer.N.attention.qkv_proj``, ``mlp.up_gate_proj`` = up then gate,
``attn_ln``/``mlp_ln``). The remote-code config names (``n_embd``, ``rotary_emb_base`` ...)
are read by :func:`.registry.standard_config`.

On CUDA: FlashInfer attention and CUDA graphs (no masks needed), and two ways to run the
non-GEMM parts, picked by :meth:`NomicBertEncoder.use_kernels`: eager torch (the CPU path
and the reference), or "fused" (:mod:`mesh.worker.engine.kernels.fused`: rotary on q and k in one
in-place pass over the QKV output, each residual add fused into its LayerNorm, and the
GLU's ``act(gate) * up`` in one kernel: SiLU, or GELU exactly as torch's erf form, so GeGLU
needs no ``exact_gelu``). There is no compiled path: "compile" runs eager torch and says so.
On the H200 the eager path reached 0.59 of BERT-base's tokens/s per FLOP, which is what the
fused path is for.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine.kernels import fused
from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.blocks import (
    FUSED_GLU,
    Activation,
    activation,
    apply_rope,
    check_default_rope,
    gated_mlp,
    layer_norm,
    rope_cos_sin,
    rope_inv_freq,
    rope_parameters,
    split_qkv,
)
from mesh.worker.engine.weights import Weights, WeightSource

# Our parts -> each layout's names. "qkv" and "gate_up" lists are concatenated in order
# (q, k, v; gate then up, the order gated_mlp reads).
LAYOUTS: dict[str, dict[str, Any]] = {
    "transformers": {
        "emb_ln": "embeddings.LayerNorm",
        "layer": "layers.{}.",
        "qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "o": "self_attn.o_proj",
        "ln1": "post_attention_layernorm",
        "gate_up": ["mlp.gate_proj", "mlp.up_proj"],
        "down": "mlp.down_proj",
        "ln2": "post_mlp_layernorm",
    },
    "nomic": {
        "emb_ln": "emb_ln",
        "layer": "encoder.layers.{}.",
        "qkv": ["attn.Wqkv"],
        "o": "attn.out_proj",
        "ln1": "norm1",
        "gate_up": ["mlp.fc12", "mlp.fc11"],
        "down": "mlp.fc2",
        "ln2": "norm2",
    },
    "gte-new": {
        "emb_ln": "embeddings.LayerNorm",
        "layer": "encoder.layer.{}.",
        "qkv": ["attention.qkv_proj"],
        "o": "attention.o_proj",
        "ln1": "attn_ln",
        "up_gate": "mlp.up_gate_proj",  # up then gate: swapped at load
        "down": "mlp.down_proj",
        "ln2": "mlp_ln",
    },
}


def _layout(source: WeightSource) -> dict[str, Any]:
    for name, layout in LAYOUTS.items():
        if layout["layer"].format(0) + layout["o"] + ".weight" in source:
            return {"name": name} | layout
    raise KeyError("no NomicBERT / GTE attention weights found in checkpoint")


def _cat(w: Weights, parts: list[str], kind: str) -> torch.Tensor | None:
    if f"{parts[0]}.{kind}" not in w:
        return None
    return w.cat([f"{p}.{kind}" for p in parts])


class RotaryPostLnLayer(nn.Module):
    def __init__(self, w: Weights, names: dict[str, Any], heads: int, eps: float, act: Activation):
        super().__init__()
        self.heads, self.eps, self.act = heads, eps, act
        self.glu = FUSED_GLU.get(act)  # None: the fused path runs this activation in torch
        self.register_buffer("qkv_w", _cat(w, names["qkv"], "weight"))
        self.register_buffer("qkv_b", _cat(w, names["qkv"], "bias"))
        for ours in ("o", "ln1", "down", "ln2"):
            self.register_buffer(f"{ours}_w", w(f"{names[ours]}.weight"))
            self.register_buffer(f"{ours}_b", w.optional(f"{names[ours]}.bias"))
        if "up_gate" in names:
            up, gate = w(f"{names['up_gate']}.weight").chunk(2, dim=0)
            self.register_buffer("gate_up_w", torch.cat((gate, up)))
            if f"{names['up_gate']}.bias" in w:
                raise NotImplementedError("gte: a bias on mlp.up_gate_proj is not supported")
            self.register_buffer("gate_up_b", None)
        else:
            self.register_buffer("gate_up_w", _cat(w, names["gate_up"], "weight"))
            self.register_buffer("gate_up_b", _cat(w, names["gate_up"], "bias"))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        d = x.shape[1] // self.heads
        q, k, v = split_qkv(F.linear(x, self.qkv_w, self.qkv_b), (self.heads, self.heads, d))
        a = attn.run(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v).reshape(x.shape)
        x = layer_norm(x + F.linear(a, self.o_w, self.o_b), self.ln1_w, self.ln1_b, self.eps)
        h = gated_mlp(x, self.gate_up_w, self.down_w, self.act, self.gate_up_b, self.down_b)
        return layer_norm(x + h, self.ln2_w, self.ln2_b, self.eps)

    def forward_fused(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """:meth:`forward` through the Triton kernels; ``cos``, ``sin`` ``[T, D]``."""
        d = x.shape[1] // self.heads
        qkv = F.linear(x, self.qkv_w, self.qkv_b)  # a fresh tensor: RoPE may write into it
        q, k, v = fused.rope_(qkv, cos, sin, self.heads, self.heads, d)
        a = attn.run(q, k, v).reshape(x.shape)
        o = F.linear(a, self.o_w, self.o_b)
        x = fused.add_layer_norm(x, o, self.ln1_w, self.ln1_b, self.eps)
        if self.glu is None:  # an activation without a kernel: the eager GLU
            h = gated_mlp(x, self.gate_up_w, self.down_w, self.act, self.gate_up_b, self.down_b)
        else:
            gate_up = F.linear(x, self.gate_up_w, self.gate_up_b)
            h = F.linear(fused.glu(gate_up, self.glu), self.down_w, self.down_b)
        return fused.add_layer_norm(x, h, self.ln2_w, self.ln2_b, self.eps)


class NomicBertEncoder(PackedEncoder):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    family = "nomic"

    def build(self, config: dict[str, Any], w: Weights) -> None:
        act = activation(str(config.get("hidden_act", "silu")), self.family)
        theta = rope_parameters(config).get("rope_theta")
        if theta is None:  # transformers' defaults are filled in by registry.standard_config
            raise NotImplementedError(
                f"{self.family}: a config without rope_theta is not supported"
            )
        self.register_buffer("inv_freq", rope_inv_freq(self.head_dim, float(theta), w.device))
        names = _layout(w.source)
        self.register_buffer("word", w("embeddings.word_embeddings.weight"))
        types = w.optional("embeddings.token_type_embeddings.weight")
        self.register_buffer("type0", None if types is None else types[0])
        self.register_buffer("emb_ln_w", w(f"{names['emb_ln']}.weight"))
        self.register_buffer("emb_ln_b", w.optional(f"{names['emb_ln']}.bias"))
        self.layers = nn.ModuleList(
            RotaryPostLnLayer(
                w.under(names["layer"].format(i)), names, self.num_heads, self.eps, act
            )
            for i in range(self.shape.num_layers)
        )

    @classmethod
    def check_supported(cls, config: dict[str, Any]) -> None:
        """Refuse what the math here does not do (the MLP's activation included)."""
        check_default_rope(rope_parameters(config), cls.family)
        refused = {
            "prenorm": True,
            "rotary_emb_interleaved": True,
            "use_rms_norm": True,
            "logn_attention_scale": True,
            "scale_attn_weights": False,  # Nomic's remote code: unscaled scores
            "causal": True,
        }
        for key, value in refused.items():
            if config.get(key) == value:
                raise NotImplementedError(f"{cls.family}: {key}: {value} is not supported")
        limits = {"rotary_emb_fraction": 1.0, "position_embedding_type": "rope"}
        limits |= {"layer_norm_type": "layer_norm", "rotary_scaling_factor": None}
        for key, served in limits.items():
            if key in config and config[key] != served:
                raise NotImplementedError(
                    f"{cls.family}: {key} {config[key]!r} is not supported ({served!r})"
                )
        if config.get("moe_every_n_layers"):
            raise NotImplementedError(f"{cls.family}: mixture-of-experts layers are not supported")
        activation(str(config.get("hidden_act", "silu")), cls.family)

    def select_kernels(self, kernels: str, exact_gelu: bool) -> str:
        """Run the layers through "fused" (Triton kernels; CUDA, or Triton's interpreter in
        tests) or eager torch, which "compile" also gets (no compiled path here).
        ``exact_gelu`` is BERT's: GeGLU's fused GELU is the erf form."""
        return "fused" if kernels == "fused" else "torch"

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.word[ids]
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)  # [T, D]
        if self.kernels == "fused":
            return self._forward_fused(x, cos, sin, attn)
        if self.type0 is not None:
            x = x + self.type0
        x = layer_norm(x, self.emb_ln_w, self.emb_ln_b, self.eps)
        for layer in self.layers:  # [T, 1, D] cos/sin: broadcast over heads
            x = layer(x, cos[:, None], sin[:, None], attn)
        return x

    def _forward_fused(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        if self.type0 is not None:  # one row, broadcast (row stride 0) over the tokens
            x = fused.add_layer_norm(
                x, self.type0.expand_as(x), self.emb_ln_w, self.emb_ln_b, self.eps
            )
        else:
            x = layer_norm(x, self.emb_ln_w, self.emb_ln_b, self.eps)
        for layer in self.layers:
            x = layer.forward_fused(x, cos, sin, attn)
        return x

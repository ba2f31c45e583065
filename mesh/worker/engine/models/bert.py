"""BERT-family encoder (MiniLM, BGE, E5, GTE) over packed batches.

Same math as Hugging Face ``BertModel`` in eval mode with absolute position embeddings and
token type 0: embeddings LayerNorm, then post-LN layers of bidirectional self-attention and
an exact-erf GELU MLP. Differences are of layout only: no padding (``[T, hidden]`` and
``cu_seqlens``), query/key/value fused into one projection at load so that each layer does
one GEMM instead of three.

The per-layer work after attention is :func:`.blocks.post_ln`, picked per model by
:meth:`BertEncoder.use_kernels`: eager torch (the CPU path and the reference), one
``torch.compile`` of it, or the fused CUDA path (:mod:`mesh.worker.engine.kernels.fused` residual +
LayerNorm kernels, bias + GELU in the up projection's cuBLASLt epilogue). XLM-RoBERTa
(:mod:`.xlm_roberta`) and MPNet (:mod:`.mpnet`) reuse these layers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.blocks import PostLn, post_ln, post_ln_for
from mesh.worker.engine.weights import Weights


class BertLayer(nn.Module):
    """One post-LN layer; ``names`` maps our parts to the checkpoint's (BERT's by default)."""

    NAMES = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "out": "attention.output.dense",
        "ln1": "attention.output.LayerNorm",
        "up": "intermediate.dense",
        "down": "output.dense",
        "ln2": "output.LayerNorm",
    }

    def __init__(
        self, w: Weights, num_heads: int, eps: float, names: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.eps = eps
        n = names or self.NAMES
        qkv = [n["q"], n["k"], n["v"]]
        self.register_buffer("qkv_w", w.cat([f"{p}.weight" for p in qkv]))
        self.register_buffer("qkv_b", w.cat([f"{p}.bias" for p in qkv]))
        for ours, theirs in (("out", "out"), ("up", "up"), ("down", "down")):
            self.register_buffer(f"{ours}_w", w(f"{n[theirs]}.weight"))
            self.register_buffer(f"{ours}_b", w(f"{n[theirs]}.bias"))
        for ln in ("ln1", "ln2"):
            self.register_buffer(f"{ln}_w", w(f"{n[ln]}.weight"))
            self.register_buffer(f"{ln}_b", w(f"{n[ln]}.bias"))

    def forward(
        self,
        x: torch.Tensor,
        attn: AttentionBackend,
        after: PostLn,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        total = x.shape[0]
        qkv = F.linear(x, self.qkv_w, self.qkv_b).view(total, 3, self.num_heads, -1)
        a = attn.run(qkv[:, 0], qkv[:, 1], qkv[:, 2], bias=bias)
        return after(
            x,
            a.reshape(x.shape),
            (self.out_w, self.out_b, self.ln1_w, self.ln1_b),
            (self.up_w, self.up_b, self.down_w, self.down_b, self.ln2_w, self.ln2_b),
            self.eps,
        )


class BertEncoder(PackedEncoder):
    """``forward(ids[T], positions[T], attn) -> [T, hidden]`` for a planned packed batch."""

    family = "bert"
    layer_names = BertLayer.NAMES
    token_types = True  # MPNet has no token type embeddings

    def build(self, config: dict[str, Any], w: Weights) -> None:
        self.pad = self.padding_index(config)
        self.register_buffer("word", w("embeddings.word_embeddings.weight"))
        self.register_buffer("pos", w("embeddings.position_embeddings.weight"))
        # Token type is always 0 for single-text embedding: fold its row in once.
        types = w("embeddings.token_type_embeddings.weight") if self.token_types else None
        self.register_buffer("type0", None if types is None else types[0])
        # Type 1 less type 0, for a cross-encoder's pairs (fold_pair_types); None with one type.
        pairs = types is not None and types.shape[0] > 1
        self.register_buffer("type1_delta", types[1] - types[0] if pairs else None)
        self.register_buffer("ln_w", w("embeddings.LayerNorm.weight"))
        self.register_buffer("ln_b", w("embeddings.LayerNorm.bias"))
        self.layers = nn.ModuleList(
            BertLayer(w.under(f"encoder.layer.{i}."), self.num_heads, self.eps, self.layer_names)
            for i in range(self.shape.num_layers)
        )
        # MPNet's relative position bias [heads, L, L]; None for absolute positions only.
        self.register_buffer("rel_bias", None)
        self._after: PostLn = post_ln

    @classmethod
    def check_supported(cls, config: dict[str, Any]) -> None:
        # Refuse variants whose math we do not implement rather than serve wrong vectors.
        kind = config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise NotImplementedError(
                f"{cls.family}: position_embedding_type {kind!r} is not supported (absolute)"
            )
        if config.get("hidden_act", "gelu") != "gelu":
            raise NotImplementedError(
                f"{cls.family}: hidden_act {config.get('hidden_act')!r} is not supported (gelu)"
            )

    def select_kernels(self, kernels: str, exact_gelu: bool) -> str:
        """Run the layers through "torch", "compile" or "fused" (CUDA; see
        :func:`.blocks.post_ln_fused`; ``exact_gelu`` keeps the eager erf GELU there)."""
        self._after = post_ln_for(kernels, exact_gelu)
        return kernels

    @classmethod
    def padding_index(cls, config: dict[str, Any]) -> int:
        """The pad token's row of the position table (RoBERTa's positions start after it);
        BERT's positions do not depend on it."""
        pad = config.get("pad_token_id")
        return 0 if pad is None else int(pad)

    def position_ids(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of the position table for each token (BERT: its position in its sequence)."""
        return positions

    def fold_pair_types(self) -> int:
        """For a cross-encoder: double the word table, its second half carrying token type 1
        (``word + type1 - type0``; type 0 is added as ever), so that a pair's second text is
        its ids shifted by the returned amount. No type input then: the same forward and CUDA
        graphs serve pairs. 0 for a model of one token type (its pairs are typed 0)."""
        if self.type1_delta is not None and not self.pair_shift:
            self.pair_shift = self.word.shape[0]
            folded = self.word.float() + self.type1_delta.float()  # rounded once, not twice
            self.word = torch.cat([self.word, folded.to(self.word.dtype)])
        return self.pair_shift

    def word_table(self) -> torch.Tensor:
        return self.word

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word[ids] + self.pos[self.position_ids(ids, positions)]
        if self.type0 is not None:
            x = x + self.type0
        return F.layer_norm(x, (self.hidden,), self.ln_w, self.ln_b, self.eps)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = self.embed(ids, positions)
        for layer in self.layers:
            x = layer(x, attn, self._after, self.rel_bias)
        return x

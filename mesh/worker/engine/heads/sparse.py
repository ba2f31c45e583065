"""Sparse (SPLADE) models: a masked-LM head after the encoder, pooled into vocabulary weights.

A SPLADE checkpoint is a ``BertForMaskedLM`` saved in sentence-transformers' sparse layout
(``MLMTransformer`` then ``SpladePooling``, :mod:`.st_config`). Its weight for vocabulary entry
``v`` in a text is ``max`` over the text's tokens ``t`` of ``log(1 + relu(logits[t, v]))`` (or
the ``sum``; ``log1p_relu`` takes log1p once more), where the logits are BERT's MLM head:
``transform.dense`` + GELU + ``transform.LayerNorm``, then the decoder, tied to the word
embeddings, plus ``cls.predictions.bias``. What ``SparseEncoder.encode`` computes, here over
packed tokens: the head runs on chunks of tokens (the ``[T, vocab]`` logits of a full batch
would be gigabytes), each chunk pooled into its sequences with one ``scatter_reduce`` (``amax``)
or ``index_add`` into a ``[n, vocab]`` fp32 buffer, no loop over sequences.

What leaves the device is bounded (:func:`sparse_rows`): per text its ``top_k`` largest weights
over ``threshold`` (every one when ``top_k`` covers the vocabulary, the default), as (id,
weight) pairs sorted by id, as TEI's ``/embed_sparse`` lists them.

On CUDA a sparse model runs eagerly (FlashInfer attention, no CUDA graphs). The graphs pay off
where the host cannot launch a batch's ~100 small kernels ahead of the GPU (MiniLM's 2 ms
batches); here every chunk ends in a ``[chunk, H] x [H, vocab]`` GEMM (for BERT-base about a
fifth of the forward's FLOPs again) and a top-k over the vocabulary, so each batch keeps the GPU
busy far longer than its launches take, and capturing would hold a ``[bucket, vocab]`` logits
buffer per token bucket in the graph pool. Measured on the H200 (``bench/families.py``, a
BERT-base-shape SPLADE on corpus texts): 0.94 M tok/s alone, 0.92 M through HTTP,
5.4x sentence-transformers' ``SparseEncoder`` (bf16); 0.49 of BERT-base's dense tokens/s per
FLOP, the head's memory-bound pooling over ``[chunk, vocab]`` being the rest (docs/performance.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mesh.worker.engine.card import ModelCard, read_config
from mesh.worker.engine.heads.pooling import segment_ids
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.registry import spec_for_config
from mesh.worker.engine.st_config import Splade
from mesh.worker.engine.weights import WeightSource

# Logits computed at once: rows per chunk = this // vocab (1099 tokens for BERT's 30522), so a
# chunk's fp32 weights take 128 MiB whatever the batch.
CHUNK_ELEMENTS = 1 << 25
_HEAD = "cls.predictions."


class SparseHead(nn.Module):
    """``forward(hidden [T, H], cu_seqlens [n + 1]) -> float32 [n, vocab]`` SPLADE weights.

    The head's GEMMs run in the model's dtype (bf16 on GPU: the decoder is the costly one); the
    activation, log1p and pooling in fp32."""

    def __init__(
        self,
        source: WeightSource,
        config: dict[str, Any],
        splade: Splade,
        word: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        act = config.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"sparse model: MLM head activation {act!r} is not served (gelu)")
        self.splade = splade
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.vocab = int(config["vocab_size"])

        def get(name: str) -> torch.Tensor:
            return source.get(_HEAD + name, dtype, device)

        try:
            self.register_buffer("dense_w", get("transform.dense.weight"))
            self.register_buffer("dense_b", get("transform.dense.bias"))
            self.register_buffer("ln_w", get("transform.LayerNorm.weight"))
            self.register_buffer("ln_b", get("transform.LayerNorm.bias"))
            bias = _HEAD + "bias" if _HEAD + "bias" in source else _HEAD + "decoder.bias"
            self.register_buffer("decoder_b", source.get(bias, dtype, device))
        except KeyError as exc:
            raise ValueError(f"sparse model: no masked-LM head ({exc.args[0]})") from None
        # Tied to the word embeddings unless the checkpoint has its own decoder; the first
        # ``vocab`` rows of ``word`` (a cross-encoder's folded second half never applies here).
        if _HEAD + "decoder.weight" in source:
            self.register_buffer("decoder_w", get("decoder.weight"))
        elif config.get("tie_word_embeddings", True) is False:
            raise ValueError("sparse model: untied decoder (tie_word_embeddings false) not found")
        else:
            self.register_buffer("decoder_w", word[: self.vocab])
        if self.decoder_w.shape[0] != self.vocab or self.decoder_b.shape != (self.vocab,):
            raise ValueError(f"sparse model: decoder does not give {self.vocab} logits")

    def weights(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per token ``log1p(relu(logits))`` (fp32 ``[t, vocab]``) of a chunk of hidden states."""
        x = F.gelu(F.linear(hidden, self.dense_w, self.dense_b))
        x = F.layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b, self.eps)
        w = torch.relu_(F.linear(x, self.decoder_w, self.decoder_b).float()).log1p_()
        return w.log1p_() if self.splade.activation == "log1p_relu" else w

    def forward(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        total, n = hidden.shape[0], cu_seqlens.numel() - 1
        seg = segment_ids(cu_seqlens, total)
        # Zeros, not -inf, under "max": every weight is >= 0 and every sequence has a token.
        out = torch.zeros(n, self.vocab, dtype=torch.float32, device=hidden.device)
        step = max(1, CHUNK_ELEMENTS // self.vocab)
        for start in range(0, total, step):
            w = self.weights(hidden[start : start + step])
            rows = seg[start : start + step]
            if self.splade.strategy == "max":
                out.scatter_reduce_(0, rows[:, None].expand(-1, self.vocab), w, "amax")
            else:
                out.index_add_(0, rows, w)
        return out


def load_sparse_head(
    model_dir: str | Path, card: ModelCard, model: PackedEncoder, device: torch.device
) -> SparseHead:
    """The SPLADE head of a sparse model's card, with its checkpoint's weights in the model's
    dtype on ``device``; ValueError naming what is missing."""
    assert card.splade is not None
    config = read_config(model_dir)
    source = WeightSource(model_dir, spec_for_config(config).prefixes)
    word = model.word_table()  # the MLM decoder is tied to it
    return SparseHead(source, config, card.splade, word, model.dtype, device).eval()


def sparse_rows(weights: torch.Tensor, top_k: int, threshold: float = 0.0) -> torch.Tensor:
    """The wire rows of the output kind "sparse" (proto_msgs.OUTPUT_KINDS): ``float32 [n, 2w]``,
    per row the ids of its ``min(top_k, vocab)`` largest weights that exceed ``threshold`` (as
    floats, exact below 2**24) sorted by id, then those weights; ``w`` is the most pairs any
    row kept (at least 1), the unused tail zeros (a weight of 0 never exceeds a threshold >= 0,
    so a reader drops it). On the weights' device, with one host synchronization (``w``)."""
    if weights.dim() != 2:
        raise ValueError(f"weights must be [n, vocab], got shape {tuple(weights.shape)}")
    if top_k < 1 or not threshold >= 0.0:
        raise ValueError(f"top_k must be positive and threshold >= 0; got {top_k}, {threshold}")
    vocab = weights.shape[1]
    if top_k >= vocab:  # every weight (the default, as TEI): no selection, only the order
        values = weights.float()
        ids = torch.arange(vocab, device=weights.device).expand(weights.shape[0], vocab)
    else:
        values, ids = weights.float().topk(top_k, dim=1)
    kept = values > threshold
    # Dropped pairs sort last under the key ``vocab``; kept ones by id, as TEI lists them.
    key, order = torch.where(kept, ids, vocab).sort(dim=1)
    # Rows as wide as the most pairs a row kept, not k: every weight of a 30,522-entry
    # vocabulary is about a hundred kept per text. The one host synchronization: the rows are
    # copied to the host next anyway.
    width = max(1, int(kept.sum(dim=1).max())) if kept.numel() else 1
    key, order = key[:, :width], order[:, :width]
    kept = key < vocab
    values = torch.where(kept, values.gather(1, order), 0.0)
    return torch.cat([torch.where(kept, key, 0).float(), values], dim=1).contiguous()

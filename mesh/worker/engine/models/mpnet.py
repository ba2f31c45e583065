"""MPNet encoder (all-mpnet-base-v2, multi-qa-mpnet) over packed batches.

BERT's post-LN layers (:class:`.bert.BertLayer` under MPNet's weight names) with RoBERTa's
positions (:class:`.xlm_roberta.XLMRobertaEncoder`, padding index 1, fixed in transformers'
``MPNetEmbeddings``), no token types, and a relative position bias shared by every layer:
``relative_attention_bias`` ``[32 buckets, heads]`` looked up by T5-style buckets of
``j - i`` (transformers' ``MPNetEncoder.relative_position_bucket``: 32 buckets, max distance
128, both fixed in its code) and added to the scaled scores. The bias depends on ``j - i``
only, so it is built once at load for the longest input and each sequence adds its
top-left block (the SDPA backends, ``takes_bias``).

On CUDA: FlashInfer's fa2 ragged prefill takes no additive bias, so MPNet runs torch SDPA
over length-sorted padded groups with the bias as its float mask (``needs_masks``:
``gpu.GpuRunner`` picks ``attention_grouped.SdpaGrouped`` and captures no graphs); the
layers' non-attention parts still take the fused Triton path. On the H200 (docs/performance.md)
MPNet-base ran 0.44 M tok/s alone, BERT-base on FlashInfer + graphs 2.42 M.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mesh.worker.engine.models.xlm_roberta import XLMRobertaEncoder
from mesh.worker.engine.weights import Weights

NUM_BUCKETS = 32
MAX_DISTANCE = 128


def relative_position_bucket(relative: torch.Tensor) -> torch.Tensor:
    """transformers' ``MPNetEncoder.relative_position_bucket`` of ``j - i``, the same ops."""
    ret = 0
    n = -relative
    half = NUM_BUCKETS // 2
    ret += (n < 0).to(torch.long) * half
    n = torch.abs(n)
    max_exact = half // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(MAX_DISTANCE / max_exact) * (half - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    return ret + torch.where(is_small, n, large)


def position_bias(table: torch.Tensor, longest: int) -> torch.Tensor:
    """The bias every layer adds, ``[heads, longest, longest]``, from the bucket table
    ``[buckets, heads]``: entry ``[h, i, j]`` is ``table[bucket(j - i), h]``."""
    i = torch.arange(longest, device=table.device)
    bucket = relative_position_bucket(i[None, :] - i[:, None])  # [i, j]
    return table[bucket].permute(2, 0, 1).contiguous()


class MPNetEncoder(XLMRobertaEncoder):
    family = "mpnet"
    position_bias = True
    token_types = False
    layer_names = {
        "q": "attention.attn.q",
        "k": "attention.attn.k",
        "v": "attention.attn.v",
        "out": "attention.attn.o",
        "ln1": "attention.LayerNorm",
        "up": "intermediate.dense",
        "down": "output.dense",
        "ln2": "output.LayerNorm",
    }

    @classmethod
    def padding_index(cls, config: dict[str, Any]) -> int:
        return 1  # MPNetEmbeddings.padding_idx, whatever the config's pad_token_id

    def build(self, config: dict[str, Any], w: Weights) -> None:
        super().build(config, w)
        buckets = int(config.get("relative_attention_num_buckets", NUM_BUCKETS))
        if buckets < NUM_BUCKETS:
            # transformers looks up 32 buckets whatever the table's size.
            raise NotImplementedError(
                f"mpnet: relative_attention_num_buckets {buckets} is not supported (>= 32)"
            )
        table = w("encoder.relative_attention_bias.weight")
        longest = int(config["max_position_embeddings"]) - self.pad - 1
        self.register_buffer("rel_bias", position_bias(table, longest))

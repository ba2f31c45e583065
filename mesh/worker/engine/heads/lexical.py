"""bge-m3's lexical weights: a dense embedder whose checkpoint also has a ``sparse_linear`` head.

FlagEmbedding's BGE-M3 puts a ``Linear(hidden, 1)`` on the last hidden states: a token's weight
is ``relu(sparse_linear(h))``, and a text's lexical weight for vocabulary entry ``v`` is the
``max`` over the text's tokens whose id is ``v``, the special tokens (CLS, EOS/SEP, PAD, UNK)
left out. Here over packed tokens in one ``scatter_reduce`` (``amax``) into a flat ``[n * vocab]``
fp32 buffer indexed by ``seq * vocab + id``, no loop over sequences or tokens; the selection of
what leaves the device is SPLADE's (:func:`.sparse.sparse_rows`). The buffer is 1 MB per
sequence for bge-m3's 250,002 entries (256 MB for a batch of 256 texts), built only for a
batch that asks for sparse output.

The head ships as ``sparse_linear.pt``, a torch pickle, which we do not load (a pickle runs
code); ``python -m mesh.worker.engine.convert_m3 DIR`` writes the ``sparse_linear.safetensors``
(``weight [1, hidden]``, ``bias [1]``) that we do. Such a model serves its dense embeddings as
any embedder and, in addition, the output kind "sparse" (``ModelCard.lexical``).

On CUDA a batch that asks for lexical weights runs eagerly (``RunnerInput.keep_hidden``,
:meth:`..gpu.GpuRunner.forward`): the graphs keep no hidden states. Its other groups still
get their pooled vectors from the same forward. Not measured on a GPU yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

HEAD_FILE = "sparse_linear.safetensors"
PICKLED_HEAD_FILE = "sparse_linear.pt"
# FlagEmbedding's unused tokens (CLS, EOS, PAD, UNK), by their tokenizer_config.json names; with
# SEP, which is EOS (``</s>``) in bge-m3's tokenizer and the end token of a BERT-style one.
_SPECIAL_NAMES = ("cls_token", "eos_token", "sep_token", "pad_token", "unk_token")


def has_lexical_head(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds bge-m3's sparse head in safetensors. ValueError naming the
    conversion when only FlagEmbedding's pickle is there."""
    model_dir = Path(model_dir)
    if (model_dir / HEAD_FILE).is_file():
        return True
    if (model_dir / PICKLED_HEAD_FILE).is_file():
        raise ValueError(
            f"{model_dir} has bge-m3's sparse head only as {PICKLED_HEAD_FILE} (a torch pickle, "
            f"which is not loaded); convert it once with "
            f"`python -m mesh.worker.engine.convert_m3 {model_dir}`"
        )
    return False


def special_ids(model_dir: str | Path) -> list[int]:
    """The ids of the tokens FlagEmbedding leaves out of the lexical weights, named in
    ``tokenizer_config.json`` (or ``special_tokens_map.json``) and found in ``tokenizer.json``."""
    from tokenizers import Tokenizer

    model_dir = Path(model_dir)
    names: dict[str, object] = {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):
        path = model_dir / file
        if path.is_file():
            names.update(json.loads(path.read_text(encoding="utf-8")))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = set()
    for key in _SPECIAL_NAMES:
        token = names.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        found = tok.token_to_id(token) if isinstance(token, str) else None
        if found is not None:
            ids.add(found)
    if not ids:
        raise ValueError(f"lexical weights: no special tokens named in {model_dir}'s tokenizer")
    return sorted(ids)


class LexicalHead(nn.Module):
    """``forward(hidden [T, H], ids [T], cu_seqlens [n + 1]) -> float32 [n, vocab]``: per
    sequence, per vocabulary entry, the largest ``relu(w . h + b)`` of its tokens of that id."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor,
        specials: list[int],
        vocab: int,
        device: torch.device,
    ) -> None:
        super().__init__()
        if weight.dim() != 2 or weight.shape[0] != 1 or bias.shape != (1,):
            raise ValueError(
                f"{HEAD_FILE}: weight must be [1, hidden] and bias [1]; got "
                f"{tuple(weight.shape)} and {tuple(bias.shape)}"
            )
        # fp32: one dot product per token, so the head's cost is nothing beside the forward.
        self.register_buffer("weight", weight.to(device, torch.float32))
        self.register_buffer("bias", bias.to(device, torch.float32))
        self.register_buffer("specials", torch.tensor(specials, dtype=torch.long, device=device))
        self.vocab = vocab

    @property
    def hidden_size(self) -> int:
        return int(self.weight.shape[1])

    def forward(
        self, hidden: torch.Tensor, ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        n = cu_seqlens.numel() - 1
        w = torch.relu_(torch.nn.functional.linear(hidden.float(), self.weight, self.bias)[:, 0])
        # Each token's sequence (pooling.segment_ids, which imports the card that imports us).
        seq = torch.arange(n, device=hidden.device).repeat_interleave(
            cu_seqlens.diff(), output_size=hidden.shape[0]
        )
        slot = seq * self.vocab + ids.long()
        # Zeros, not -inf, under "amax": every weight is >= 0, an absent id weighs 0.
        out = torch.zeros(n * self.vocab, dtype=torch.float32, device=hidden.device)
        out.scatter_reduce_(0, slot, w, "amax")
        out = out.view(n, self.vocab)
        out[:, self.specials] = 0.0
        return out


def load_lexical_head(
    model_dir: str | Path, vocab: int, hidden_size: int, device: torch.device
) -> LexicalHead:
    """The sparse head of a model whose card says ``lexical``; ValueError naming what is wrong."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(model_dir) / HEAD_FILE))
    if set(tensors) != {"weight", "bias"}:
        raise ValueError(f"{HEAD_FILE} must hold 'weight' and 'bias'; it holds {sorted(tensors)}")
    head = LexicalHead(tensors["weight"], tensors["bias"], special_ids(model_dir), vocab, device)
    if head.hidden_size != hidden_size:
        raise ValueError(
            f"{HEAD_FILE} reads {head.hidden_size} features; the model has {hidden_size}"
        )
    return head.eval()

"""Multi-vector (late-interaction) heads: a linear projection of each token's final hidden state.

bge-m3's colbert vectors (FlagEmbedding ``BGEM3Model._colbert_embedding``): ``colbert_linear``
(``Linear(hidden, hidden)``, with bias) applied to the last hidden state of every token but the
first (``<s>``, position 0), then L2-normalized per token. The token at position 0 is left out by
the ingress (it asks for one span per token from position 1 on, the final ``</s>`` included, as
FlagEmbedding keeps ``tokens_num - 1`` vectors); the engine projects the span rows on the device
in fp32, and the output's normalization (``outputs.finalize_tensor``) does the rest.

FlagEmbedding ships the head as ``colbert_linear.pt``, a pickle, which we never load: the model
directory must hold ``colbert_linear.safetensors`` (``python -m mesh.worker.engine.convert_m3
DIR`` writes it from the .pt, or ``safetensors.torch.save_file(torch.load(path,
weights_only=True), ...)``).

ColBERT checkpoints themselves (colbert-ai's ``HF_ColBERT``, PyLate) project the same way, but
their tokens are not the text's: a ``[Q]``/``[D]`` marker after ``[CLS]``, queries padded with
``[MASK]`` to ``query_maxlen`` and attending to them, punctuation dropped from documents. Those are
not served yet, so such a model is refused at load by name (:func:`read_multivector`) rather than
answered with vectors its index was not built with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

M3_HEAD = "colbert_linear"


@dataclass
class MultiVector:
    """A model's multi-vector head as the card describes it."""

    file: str  # the safetensors file, relative to the model directory
    in_features: int
    out_features: int
    bias: bool
    skip_first: bool  # the first token (CLS, <s>) has no vector


def _colbert_layout(model_dir: Path, config: dict[str, Any]) -> str | None:
    """What names a ColBERT checkpoint (colbert-ai or PyLate), else None."""
    if any("ColBERT" in a for a in config.get("architectures") or []):
        return "architectures " + ", ".join(config["architectures"])
    for name in ("artifact.metadata", "config_sentence_transformers.json"):
        path = model_dir / name
        if path.is_file() and (
            name == "artifact.metadata" or "query_prefix" in json.loads(path.read_text("utf-8"))
        ):
            return name
    return None


def read_multivector(model_dir: str | Path, config: dict[str, Any]) -> MultiVector | None:
    """bge-m3's colbert head when the directory holds one; None when it holds none. ValueError
    for a pickle-only head (naming the conversion) and for a ColBERT checkpoint (naming what
    is not served)."""
    model_dir = Path(model_dir)
    layout = _colbert_layout(model_dir, config)
    if layout is not None:
        raise ValueError(
            f"ColBERT model ({layout}): its [Q]/[D] markers, [MASK] query augmentation and "
            "punctuation skiplist are not served; bge-m3's colbert vectors are"
        )
    weights = model_dir / f"{M3_HEAD}.safetensors"
    if not weights.is_file():
        if (model_dir / f"{M3_HEAD}.pt").is_file():
            raise ValueError(
                f"{M3_HEAD}.pt is a pickle, which is never loaded: convert it with "
                f"`python -m mesh.worker.engine.convert_m3 {model_dir}` "
                f"(writes {M3_HEAD}.safetensors; colbert.convert_pickled_head does the same)"
            )
        return None
    tensors = load_file(str(weights))
    weight = tensors.get("weight")
    hidden = int(config["hidden_size"])
    if weight is None or weight.dim() != 2 or weight.shape[1] != hidden:
        raise ValueError(
            f"{weights.name}: needs 'weight' [out, {hidden}], has "
            f"{ {k: tuple(v.shape) for k, v in tensors.items()} }"
        )
    return MultiVector(weights.name, hidden, int(weight.shape[0]), "bias" in tensors, True)


def convert_pickled_head(model_dir: str | Path) -> Path | None:
    """Write ``colbert_linear.safetensors`` from FlagEmbedding's ``colbert_linear.pt`` (read
    with ``torch.load(weights_only=True)``: plain tensors, nothing that runs code); its path,
    or None when the directory has no such pickle. ``convert_m3`` calls it."""
    model_dir = Path(model_dir)
    pickled = model_dir / f"{M3_HEAD}.pt"
    if not pickled.is_file():
        return None
    from safetensors.torch import save_file

    state = torch.load(pickled, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not {"weight"} <= set(state) <= {"weight", "bias"}:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{pickled.name} must hold 'weight' (and 'bias'); it holds {keys}")
    out = model_dir / f"{M3_HEAD}.safetensors"
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out))
    return out


def load_multivector(
    model_dir: str | Path, head: MultiVector | None, device: torch.device
) -> torch.nn.Linear | None:
    """The head's linear in fp32 on ``device`` (None without a head); normalization is the
    output's (``OutputOptions.normalize``)."""
    if head is None:
        return None
    linear = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias)
    try:
        linear.load_state_dict(load_file(str(Path(model_dir) / head.file)))
    except RuntimeError as exc:
        raise ValueError(f"{head.file}: {exc}") from None
    return linear.to(device=device, dtype=torch.float32).eval()

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

ColBERT checkpoints (colbert-ai's ``HF_ColBERT``, PyLate) project the same way, with their
own tokens (:mod:`.late_interaction` reads their layout): their head is read here from
``linear.weight`` in the checkpoint or PyLate's Dense folder, every token has a vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mesh.worker.engine.heads.late_interaction import ColbertModel

M3_HEAD = "colbert_linear"


@dataclass
class MultiVector:
    """A model's multi-vector head as the card describes it."""

    file: str  # the safetensors file, relative to the model directory
    in_features: int
    out_features: int
    bias: bool
    skip_first: bool  # the first token (CLS, <s>) has no vector
    prefix: str = ""  # the head's tensor names in ``file``: prefix + "weight" (+ "bias")


def read_multivector(
    model_dir: str | Path, config: dict[str, Any], colbert: ColbertModel | None = None
) -> MultiVector | None:
    """The model's multi-vector head: a ColBERT checkpoint's projection (``colbert``, from
    :func:`.late_interaction.read_colbert`), else bge-m3's colbert head when the directory
    holds one; None when it holds none. ValueError for a pickle-only head (naming the
    conversion) and for a head of the wrong shape."""
    model_dir = Path(model_dir)
    if colbert is not None:
        return _colbert_head(model_dir, config, colbert)
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


def _colbert_head(model_dir: Path, config: dict[str, Any], colbert: ColbertModel) -> MultiVector:
    path = model_dir / colbert.head_file
    if not path.is_file():
        raise ValueError(
            f"ColBERT model ({colbert.layout}): no {colbert.head_file} (its projection)"
        )
    with safe_open(str(path), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    weight = shapes.get(colbert.head_prefix + "weight")
    hidden = int(config["hidden_size"])
    if weight is None or len(weight) != 2 or weight[1] != hidden:
        raise ValueError(f"ColBERT model ({colbert.layout}): {colbert.head_file} needs "
                         f"'{colbert.head_prefix}weight' [dim, {hidden}], has {weight}")  # fmt: skip
    bias = colbert.head_prefix + "bias" in shapes
    return MultiVector(colbert.head_file, hidden, int(weight[0]), bias, False, colbert.head_prefix)


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
    names = ["weight", "bias"] if head.bias else ["weight"]
    with safe_open(str(Path(model_dir) / head.file), "pt") as f:
        state = {n: f.get_tensor(head.prefix + n) for n in names if head.prefix + n in f.keys()}  # noqa: SIM118
    try:
        linear.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"{head.file}: {exc}") from None
    return linear.to(device=device, dtype=torch.float32).eval()

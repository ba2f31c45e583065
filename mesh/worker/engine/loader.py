"""Build a model directory's family module with its weights (:mod:`.models.registry` says
which family and which checkpoint prefixes; :mod:`.weights` reads the tensors)."""

from __future__ import annotations

from pathlib import Path

import torch

from mesh.worker.engine.card import ModelCard, read_config
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.registry import model_class, spec_for_config
from mesh.worker.engine.weights import WeightSource

__all__ = ["WeightSource", "default_dtype", "load_model"]


def default_dtype(family: str, device: torch.device | str) -> torch.dtype:
    """fp32 on CPU (half precision is slow there); bf16 on GPU for every family (fp16, which
    keeps 3 more mantissa bits, is selectable: ``--dtype float16``; Qwen3 activations can
    overflow its range)."""
    if torch.device(device).type == "cpu":
        return torch.float32
    return torch.bfloat16


def load_model(
    model_dir: str | Path,
    card: ModelCard,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> PackedEncoder:
    """Build the family's module for ``model_dir`` with its weights, in eval mode.

    Every family module takes ``(config, source, dtype, device, causal)`` and refuses, with
    NotImplementedError naming the option, a config whose math it does not implement.
    """
    config = read_config(model_dir)
    spec = spec_for_config(config)
    dtype = dtype or default_dtype(spec.family, device)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {dtype}")
    source = WeightSource(model_dir, spec.prefixes)
    model = model_class(spec)(config, source, dtype, device, causal=card.causal)
    return model.eval()

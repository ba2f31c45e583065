"""Weights from ``*.safetensors`` in Hugging Face layout into our own model modules.

Tensors are read one at a time (``safe_open`` maps the file; nothing is read before it is
asked for) and converted to the target dtype and device as they are taken, so that loading
a large model needs about one copy of it, not two.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from mesh.worker.engine.card import ModelCard, model_family, read_config

# Checkpoints of the same weights differ by the head class that saved them:
# BertModel (no prefix), BertForMaskedLM ("bert."), Qwen3Model (none), Qwen3ForCausalLM
# ("model."). Keys outside the backbone (lm_head, cls.*, pooler) are simply never asked for.
_PREFIXES = ("bert.", "model.")


class WeightSource:
    """Named tensors of a model directory, prefixes stripped, read lazily."""

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({model_dir / f for f in weight_map.values()})
        else:
            files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where: dict[str, tuple[int, str]] = {}
        for i, handle in enumerate(self._handles):
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                name = _strip_prefix(key)
                if name in self._where:
                    raise ValueError(f"weight {name!r} appears twice (as {key!r})")
                self._where[name] = (i, key)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """One tensor, converted; KeyError names the missing weight."""
        if name not in self._where:
            raise KeyError(f"weight {name!r} not found in checkpoint")
        i, key = self._where[name]
        return self._handles[i].get_tensor(key).to(device=device, dtype=dtype)

    def cat(self, names: list[str], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """Several tensors concatenated on dim 0: fused QKV and gate/up projections."""
        return torch.cat([self.get(n, dtype, device) for n in names], dim=0)


def _strip_prefix(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


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
) -> torch.nn.Module:
    """Build the family's module for ``model_dir`` with its weights, in eval mode."""
    config = read_config(model_dir)
    family = model_family(config)
    dtype = dtype or default_dtype(family, device)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {dtype}")
    source = WeightSource(model_dir)
    if family == "bert":
        from mesh.worker.engine.bert import BertEncoder

        model: torch.nn.Module = BertEncoder(config, source, dtype, device)
    else:
        from mesh.worker.engine.qwen3 import Qwen3Embedder

        model = Qwen3Embedder(config, source, dtype, device, causal=card.causal)
    return model.eval()

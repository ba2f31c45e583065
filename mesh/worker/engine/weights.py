"""Weights from ``*.safetensors`` in Hugging Face layout, by the names our models ask for.

Tensors are read one at a time (``safe_open`` maps the file; nothing is read before it is
asked for) and converted to the target dtype and device as they are taken, so that loading
a large model needs about one copy of it, not two. This module imports no model: the
prefixes to strip come from the family's entry in :mod:`mesh.worker.engine.models.registry`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from mesh.worker.engine.heads.colbert import M3_HEAD as M3_COLBERT_HEAD
from mesh.worker.engine.heads.lexical import HEAD_FILE as LEXICAL_HEAD_FILE

# FlagEmbedding's heads beside a bge-m3 backbone (converted by ``convert_m3``): read by
# ``lexical.py`` and ``colbert.py`` on their own, never part of the backbone's weights. Both hold
# ``weight`` and ``bias``, so reading them with the backbone made a real bge-m3 (both heads)
# fail to load ("weight 'bias' appears twice").
SIDE_HEAD_FILES = (LEXICAL_HEAD_FILE, f"{M3_COLBERT_HEAD}.safetensors")


class WeightSource:
    """Named tensors of a model directory, checkpoint prefixes stripped, read lazily.

    ``prefixes``: the backbone's prefixes in checkpoints saved by a head class (longest
    first); a key is stripped of the first that it starts with. Keys outside the backbone
    (``lm_head``, ``cls.*``, a pooler) are simply never asked for.
    """

    def __init__(self, model_dir: str | Path, prefixes: tuple[str, ...] = ()) -> None:
        model_dir = Path(model_dir)
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({model_dir / f for f in weight_map.values()})
        else:
            files = sorted(
                f for f in model_dir.glob("*.safetensors") if f.name not in SIDE_HEAD_FILES
            )
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where: dict[str, tuple[int, str]] = {}
        for i, handle in enumerate(self._handles):
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                name = _strip_prefix(key, prefixes)
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


class Weights:
    """A model's view of a :class:`WeightSource`: names under ``prefix``, taken in one dtype
    on one device. ``w("dense.weight")``; ``w.under("layer.0.")`` for a sub-module."""

    def __init__(
        self,
        source: WeightSource,
        dtype: torch.dtype,
        device: torch.device | str,
        prefix: str = "",
    ) -> None:
        self.source, self.dtype, self.device, self.prefix = source, dtype, device, prefix

    def __call__(self, name: str) -> torch.Tensor:
        return self.source.get(self.prefix + name, self.dtype, self.device)

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.source

    def optional(self, name: str) -> torch.Tensor | None:
        """The tensor, or None where the checkpoint has none (a bias a config turned off)."""
        return self(name) if name in self else None

    def cat(self, names: list[str]) -> torch.Tensor:
        return self.source.cat([self.prefix + n for n in names], self.dtype, self.device)

    def under(self, prefix: str) -> Weights:
        return Weights(self.source, self.dtype, self.device, self.prefix + prefix)


def _strip_prefix(key: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key

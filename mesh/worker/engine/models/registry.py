"""The families the engine serves, keyed by ``config.json``'s ``model_type``: one table.

Each entry says where the family's code lives, which checkpoint prefixes its weights may
carry (the head class that saved them: ``BertForMaskedLM`` writes ``bert.``, a
``*ForCausalLM`` writes ``model.``, ...), whether it may attend causally, and how its
positions bound an input. The card reads this table to accept a model and pick its
defaults; the loader reads it to build the model. This module imports neither torch nor
any model, so that reading a card stays cheap.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from mesh.worker.engine.models.base import PackedEncoder

Family = Literal[
    "bert", "xlm-roberta", "mpnet", "qwen3", "qwen2", "mistral", "modernbert", "nomic", "gemma3"
]
# How the position table bounds an input: "table" (absolute positions from 0: at most
# max_position_embeddings tokens), "after_pad" (RoBERTa-style, from padding_idx + 1: two
# fewer), "rotary" (no table: the sentence-transformers limit, else max_position_embeddings).
PositionLimit = Literal["table", "after_pad", "rotary"]


@dataclass(frozen=True)
class FamilySpec:
    family: Family
    model_types: tuple[str, ...]
    module: str  # under mesh.worker.engine.models
    cls: str
    # Checkpoint prefixes of the backbone, longest first; keys without one are taken as is.
    prefixes: tuple[str, ...]
    decoder: bool = False  # may attend causally (then last-token pooling by default)
    positions: PositionLimit = "table"
    # A sliding window the model does not run: the card caps inputs at its width so that it
    # never binds (Mistral's 4096).
    window_bounds_input: bool = False


# The prefix comments name what each head class writes before the backbone's names; the
# base model (BertModel, Qwen3Model, ...) writes none. "0.auto_model." is a
# sentence-transformers state dict saved whole.
FAMILIES: tuple[FamilySpec, ...] = (
    # BertForMaskedLM & co: "bert.".
    FamilySpec("bert", ("bert",), "bert", "BertEncoder", ("0.auto_model.", "bert.")),
    # XLMRobertaForMaskedLM, RobertaForMaskedLM & co: "roberta.".
    FamilySpec(
        "xlm-roberta",
        ("xlm-roberta", "roberta"),
        "xlm_roberta",
        "XLMRobertaEncoder",
        ("0.auto_model.", "roberta."),
        positions="after_pad",
    ),
    # MPNetForMaskedLM & co: "mpnet.".
    FamilySpec(
        "mpnet",
        ("mpnet",),
        "mpnet",
        "MPNetEncoder",
        ("0.auto_model.", "mpnet."),
        positions="after_pad",
    ),
    # ModernBertForMaskedLM & co: "model.".
    FamilySpec(
        "modernbert",
        ("modernbert",),
        "modernbert",
        "ModernBertEncoder",
        ("model.",),
        positions="rotary",
    ),
    # transformers' NomicBertModel / GteModel, whose heads write "nomic_bert." / "gte.", and
    # the Hub's remote-code NomicBertModel and NewModel, whose heads write "new.".
    FamilySpec(
        "nomic",
        ("nomic_bert", "gte", "new"),
        "nomic",
        "NomicBertEncoder",
        ("0.auto_model.", "nomic_bert.", "gte.", "new."),
        positions="rotary",
    ),
    # *ForCausalLM: "model." (lm_head is never asked for).
    FamilySpec(
        "gemma3",
        ("gemma3_text",),
        "gemma3",
        "Gemma3Embedder",
        ("model.",),
        decoder=True,
        positions="rotary",
    ),
    FamilySpec(
        "qwen3",
        ("qwen3",),
        "decoder",
        "Qwen3Embedder",
        ("model.",),
        decoder=True,
        positions="rotary",
    ),
    FamilySpec(
        "qwen2",
        ("qwen2",),
        "decoder",
        "Qwen2Embedder",
        ("model.",),
        decoder=True,
        positions="rotary",
    ),
    FamilySpec(
        "mistral",
        ("mistral",),
        "decoder",
        "MistralEmbedder",
        ("model.",),
        decoder=True,
        positions="rotary",
        window_bounds_input=True,
    ),
)

_BY_MODEL_TYPE: dict[str, FamilySpec] = {t: f for f in FAMILIES for t in f.model_types}
_BY_FAMILY: dict[str, FamilySpec] = {f.family: f for f in FAMILIES}


def spec_for_config(config: dict[str, Any]) -> FamilySpec:
    """The family of a ``config.json``; ValueError naming the model_type and those served."""
    model_type = str(config.get("model_type", ""))
    spec = _BY_MODEL_TYPE.get(model_type)
    if spec is None:
        served = ", ".join(sorted(_BY_MODEL_TYPE))
        raise ValueError(f"unsupported model_type {model_type!r}; served: {served}")
    return spec


# Remote-code config names (the Hub's nomic-embed-text) -> the transformers names that the
# card and the models read; taken only where the transformers name is absent.
_CONFIG_ALIASES: dict[str, dict[str, str]] = {
    "nomic_bert": {
        "n_embd": "hidden_size",
        "n_head": "num_attention_heads",
        "n_layer": "num_hidden_layers",
        "n_positions": "max_position_embeddings",
        "layer_norm_epsilon": "layer_norm_eps",
        "rotary_emb_base": "rope_theta",
    },
}
# Nomic's remote code: these activation_function values make a gated MLP of that activation;
# any other makes an ungated one, which the family does not implement.
_NOMIC_GLU = {"swiglu": "silu", "geglu": "gelu", "glu": "sigmoid"}
# transformers' default rope theta where a config states none.
_DEFAULT_THETA = {"nomic_bert": 1000.0, "gte": 160_000.0}


def standard_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` with remote-code names read as transformers names (a copy; the
    original where nothing applies)."""
    model_type = str(config.get("model_type", ""))
    aliases = _CONFIG_ALIASES.get(model_type, {})
    if not aliases and model_type not in _DEFAULT_THETA:
        return config
    out = dict(config)
    for old, new in aliases.items():
        if old in out and new not in out:
            out[new] = out[old]
    if model_type == "nomic_bert" and "activation_function" in out and "hidden_act" not in out:
        fn = str(out["activation_function"])
        out["hidden_act"] = _NOMIC_GLU.get(fn, f"{fn} (ungated MLP)")
    if "rope_theta" not in out and not out.get("rope_parameters"):
        out["rope_theta"] = _DEFAULT_THETA.get(model_type)
    return out


def spec_for_family(family: str) -> FamilySpec:
    return _BY_FAMILY[family]


def model_class(spec: FamilySpec) -> type[PackedEncoder]:
    """The family's model class (imports its module, and torch with it)."""
    module = importlib.import_module(f"mesh.worker.engine.models.{spec.module}")
    return cast("type[PackedEncoder]", getattr(module, spec.cls))

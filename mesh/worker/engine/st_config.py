"""The sentence-transformers pipeline of a model directory, read and checked once at load.

Served: ``Transformer``, then ``Pooling`` (every mode, several concatenated), then any number
of ``Dense`` layers, then ``Normalize``; ``prompts`` and ``default_prompt_name`` from
``config_sentence_transformers.json``. Both layouts sentence-transformers has saved are read:
the ``pooling_mode_*`` flags of older releases and the ``pooling_mode`` names of newer ones,
``sentence_transformers.models.Dense`` and ``sentence_transformers.base.modules.dense.Dense``.
Anything else (another module, a Dense that reads token embeddings, an activation we do not
build) raises ValueError naming it: never a different vector. ``include_prompt: false`` is
served: the ingress counts the prompt's tokens and the engine leaves them out of the pooling.

Sparse (SPLADE) models: ``MLMTransformer`` (or a ``Transformer`` whose ``transformer_task`` is
``fill-mask``, as sentence-transformers 5.4+ saves it) then ``SpladePooling`` and nothing else
(:mod:`.sparse` serves them); either module without the other is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# One pooling mode; a card's ``pooling`` is one or several joined by "+" (pooling.pool).
Pooling = Literal["mean", "cls", "last", "max", "mean_sqrt_len", "weightedmean"]

# sentence-transformers' pooling flags (older saves), in the order its Pooling concatenates
# their vectors, and its mode names (newer saves: ``pooling_mode``, a name or a list).
POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "last",
}
_POOLING_NAMES: dict[str, Pooling] = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "last",
}
_SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer",
                      "SpladePooling")  # fmt: skip
# SpladePooling's options served: its pooling over tokens and its activation before log1p.
SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
# Dense activations served: torch.nn classes built with their defaults, as sentence-transformers
# builds them from the saved class path (``torch.nn.modules.activation.Tanh``).
DENSE_ACTIVATIONS = ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU")


@dataclass(frozen=True)
class DenseLayer:
    """One ``Dense`` module: ``activation(x @ W.T + b)``, plus ``x`` (or ``x @ R.T`` when the
    widths differ) with ``residual``; weights in ``<path>/model.safetensors``."""

    path: str  # the module's folder, relative to the model directory
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"  # one of DENSE_ACTIVATIONS
    residual: bool = False


@dataclass(frozen=True)
class Splade:
    """A ``SpladePooling`` module: per token ``log1p(relu(logits))`` (``log1p_relu``: log1p once
    more), then the ``max`` (or ``sum``) over the sequence's tokens."""

    strategy: str = "max"  # one of SPLADE_STRATEGIES
    activation: str = "relu"  # one of SPLADE_ACTIVATIONS


@dataclass
class StPipeline:
    """What the sentence-transformers files say; empty for a plain transformers directory."""

    # The Pooling config with the legacy flags filled in from ``pooling_mode`` (so callers
    # read one layout); None without a Pooling module.
    pooling_config: dict[str, Any] | None = None
    pooling: tuple[Pooling, ...] = ()  # in concatenation order; () without a Pooling module
    include_prompt: bool = True
    dense: list[DenseLayer] = field(default_factory=list)
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    splade: Splade | None = None  # a sparse model's pooling; None for every other model


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_st_pipeline(model_dir: Path) -> StPipeline:
    """Read and check the pipeline of ``model_dir``; raises ValueError for what is not served."""
    entries = _read_json(model_dir / "modules.json") or []
    # PyLate's modules are a ColBERT model's head, read by late_interaction.py.
    entries = [e for e in entries if not str(e.get("type", "")).startswith("pylate.")]
    names = [str(e.get("type", "")).rsplit(".", 1)[-1] for e in entries]
    for name in names:
        if name not in _SUPPORTED_MODULES:
            raise ValueError(
                f"sentence-transformers module {name!r} is not supported (served: "
                f"{', '.join(_SUPPORTED_MODULES)})"
            )
    _check_order(names)
    out = StPipeline(normalize="Normalize" in names)
    paths = [str(e.get("path", "")) for e in entries]
    pool_dir = next((p for p, n in zip(paths, names, strict=True) if n == "Pooling"), None)
    # Hand-assembled directories often have 1_Pooling/ without a modules.json.
    cfg = _read_json(model_dir / (pool_dir or "1_Pooling") / "config.json")
    if cfg is not None:
        out.pooling_config, out.pooling = _pooling(cfg)
        out.include_prompt = cfg.get("include_prompt", True) is not False
    out.dense = [_dense(model_dir, p) for p, n in zip(paths, names, strict=True) if n == "Dense"]
    out.prompts, out.default_prompt_name = _prompts(model_dir)
    out.splade = _splade(model_dir, names, paths)
    return out


def _splade(model_dir: Path, names: list[str], paths: list[str]) -> Splade | None:
    st_cfg = _read_json(model_dir / "sentence_bert_config.json") or {}
    mlm = "MLMTransformer" in names or st_cfg.get("transformer_task") == "fill-mask"
    if not mlm and "SpladePooling" not in names:
        return None
    if names not in (["MLMTransformer", "SpladePooling"], ["Transformer", "SpladePooling"]):
        raise ValueError(
            f"a sparse model must be MLMTransformer then SpladePooling and nothing else; got "
            f"{names} (served: SPLADE with its masked-LM head)"
        )
    if not mlm:
        raise ValueError("SpladePooling after a Transformer that is not fill-mask is not served")
    cfg = _read_json(model_dir / paths[1] / "config.json") or {}
    splade = Splade(
        str(cfg.get("pooling_strategy", "max")), str(cfg.get("activation_function", "relu"))
    )
    if splade.strategy not in SPLADE_STRATEGIES or splade.activation not in SPLADE_ACTIVATIONS:
        raise ValueError(
            f"SpladePooling {splade} is not served (pooling_strategy: "
            f"{', '.join(SPLADE_STRATEGIES)}; activation_function: {', '.join(SPLADE_ACTIVATIONS)})"
        )
    return splade


def _check_order(names: list[str]) -> None:
    # Normalize is applied last, after Matryoshka truncation (outputs.finalize): a Dense after
    # it, or a second one, would see other vectors than the reference's.
    if "Normalize" in names and names.index("Normalize") != len(names) - 1:
        raise ValueError(f"a module after Normalize is not supported: {names}")
    dense = [i for i, n in enumerate(names) if n == "Dense"]
    if dense and ("Pooling" not in names or dense[0] < names.index("Pooling")):
        raise ValueError(f"a Dense module before Pooling is not supported: {names}")


def _pooling(cfg: dict[str, Any]) -> tuple[dict[str, Any], tuple[Pooling, ...]]:
    cfg = dict(cfg)
    named = cfg.get("pooling_mode")
    if named is not None:
        wanted = [named] if isinstance(named, str) else list(named)
        unknown = [m for m in wanted if m not in _POOLING_NAMES]
        if unknown:
            raise ValueError(f"pooling mode {unknown} is not supported")
        modes = tuple(_POOLING_NAMES[m] for m in wanted)
        for flag, mode in POOLING_FLAGS.items():
            cfg[flag] = mode in modes
        return cfg, modes
    return cfg, tuple(mode for flag, mode in POOLING_FLAGS.items() if cfg.get(flag))


def _dense(model_dir: Path, path: str) -> DenseLayer:
    cfg = _read_json(model_dir / path / "config.json")
    if cfg is None:
        raise ValueError(f"Dense module {path!r} has no config.json")
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, "sentence_embedding") != "sentence_embedding":
            raise ValueError(
                f"Dense module {path!r} maps {key}={cfg[key]!r}; only a Dense over the sentence "
                "embedding is supported"
            )
    # sentence-transformers' default when the key is absent is Tanh.
    activation = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
    short = activation.rsplit(".", 1)[-1]
    if not activation.startswith("torch.nn.") or short not in DENSE_ACTIVATIONS:
        raise ValueError(
            f"Dense module {path!r}: activation {activation!r} is not supported (served: "
            f"torch.nn {', '.join(DENSE_ACTIVATIONS)})"
        )
    return DenseLayer(
        path=path,
        in_features=int(cfg["in_features"]),
        out_features=int(cfg["out_features"]),
        bias=bool(cfg.get("bias", True)),
        activation=short,
        residual=bool(cfg.get("use_residual", False)),
    )


def _prompts(model_dir: Path) -> tuple[dict[str, str], str | None]:
    cfg = _read_json(model_dir / "config_sentence_transformers.json") or {}
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ValueError("config_sentence_transformers.json: prompts must map names to texts")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(
            f"config_sentence_transformers.json: default_prompt_name {default!r} is not one "
            f"of the prompts ({', '.join(prompts) or 'none'})"
        )
    return dict(prompts), default

"""Cross-encoder heads: what turns a sequence-classification checkpoint into label logits.

A classifier head is CLS pooling followed by Dense layers, so it reuses the embedding path
(:mod:`.pooling`, :mod:`.dense`, on CPU and inside the CUDA graphs) with the checkpoint's own
head weights (:func:`.dense.load_classifier` loads them; this module imports no torch):

- ``BertForSequenceClassification``: the pooler, ``tanh(dense([CLS]))``, then ``classifier``,
  a linear layer to ``num_labels`` logits;
- ``XLMRobertaForSequenceClassification`` / ``RobertaForSequenceClassification`` /
  ``MPNetForSequenceClassification``: ``classifier.dense`` with tanh on ``<s>``, then
  ``classifier.out_proj``.

Dropout is off in eval, so that is all of it. The layers run in fp32, as Dense layers do. The
scores' activation is the ingress's (it knows ``raw_scores``): the sentence-transformers
``CrossEncoder`` one when its config names one, else TEI's rule (sigmoid for one label, softmax
over several). A head, family or activation not listed here is refused at load by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mesh.worker.engine.st_config import DenseLayer, StPipeline

# Architecture -> (families it may come in, its head: (weight prefix, activation) per layer).
_ROBERTA_HEAD = (("classifier.dense", "Tanh"), ("classifier.out_proj", "Identity"))
HEADS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "BertForSequenceClassification": (
        ("bert",),
        (("pooler.dense", "Tanh"), ("classifier", "Identity")),
    ),
    "XLMRobertaForSequenceClassification": (("xlm-roberta",), _ROBERTA_HEAD),
    "RobertaForSequenceClassification": (("xlm-roberta",), _ROBERTA_HEAD),
    "MPNetForSequenceClassification": (("mpnet",), _ROBERTA_HEAD),
}
# sentence-transformers CrossEncoder activations (the torch.nn class it saves) -> ours.
ACTIVATIONS = {
    "Sigmoid": "sigmoid",
    "Identity": "identity",
    "Tanh": "tanh",
    "Softmax": "softmax",
}


@dataclass(frozen=True)
class ClassifierHead:
    layers: list[DenseLayer]  # ``path``: the layer's weight prefix in the model's checkpoint
    labels: list[str]  # by logit index
    activation: str  # one of ACTIVATIONS' values


def read_classifier(
    model_dir: Path, config: dict[str, Any], family: str, st: StPipeline
) -> ClassifierHead | None:
    """The head of a ``*ForSequenceClassification`` config; None for any other config.
    ValueError naming what is not served (head, family, activation, pipeline modules)."""
    arch = next(iter(config.get("architectures") or []), "")
    if not arch.endswith("ForSequenceClassification"):
        return None
    if arch not in HEADS:
        raise ValueError(
            f"sequence-classification head {arch!r} is not served (served: {', '.join(HEADS)})"
        )
    families, layers = HEADS[arch]
    if family not in families:
        raise ValueError(f"{arch} of a {family!r} model is not served")
    if st.pooling or st.dense or st.normalize or st.prompts:
        raise ValueError(
            f"a {arch} with sentence-transformers Pooling/Dense/Normalize modules or prompts "
            "is not served (a CrossEncoder is its Transformer alone)"
        )
    labels = _labels(config)
    hidden = int(config["hidden_size"])
    widths = [hidden] * len(layers) + [len(labels)]
    dense = [
        DenseLayer(path=prefix, in_features=widths[i], out_features=widths[i + 1],
                   activation=act)
        for i, (prefix, act) in enumerate(layers)
    ]  # fmt: skip
    return ClassifierHead(dense, labels, _activation(model_dir, config, len(labels)))


def _labels(config: dict[str, Any]) -> list[str]:
    id2label = config.get("id2label") or {}
    # transformers leaves its default out of config.json: two labels, LABEL_0 and LABEL_1.
    n = int(config.get("num_labels") or len(id2label) or 2)
    if id2label and len(id2label) != n:
        raise ValueError(f"config.json: id2label has {len(id2label)} labels, num_labels {n}")
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]


def _activation(model_dir: Path, config: dict[str, Any], labels: int) -> str:
    """The CrossEncoder's saved activation (sentence-transformers 5+ in
    config_sentence_transformers.json, 3-4 in config.json's ``sentence_transformers``, older
    as ``sbert_ce_default_activation_function``); else TEI's rule."""
    st_path = model_dir / "config_sentence_transformers.json"
    st_cfg = json.loads(st_path.read_text(encoding="utf-8")) if st_path.is_file() else {}
    named = (
        st_cfg.get("activation_fn")
        or (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
    )
    if not named:
        return "sigmoid" if labels == 1 else "softmax"
    short = str(named).rsplit(".", 1)[-1]
    if not str(named).startswith("torch.nn.") or short not in ACTIVATIONS:
        raise ValueError(
            f"cross-encoder activation {named!r} is not supported (served: torch.nn "
            f"{', '.join(ACTIVATIONS)})"
        )
    return ACTIVATIONS[short]

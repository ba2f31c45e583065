"""A cross-encoder's logits into scores, as its reference does, on the client's side.

The worker returns raw logits ``float32 [n, labels]`` (what ``raw_scores`` asks for); the
activation is the model card's (``ModelInfo.activation``): the sentence-transformers
``CrossEncoder``'s configured ``activation_fn`` when it names one, else TEI's rule, sigmoid for
one label and softmax over several. Computed in float64 and returned as float32, so a large
logit saturates to 1.0 instead of overflowing.
"""

from __future__ import annotations

import numpy as np

from mesh.errors import ProtocolViolation


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """``logits`` ``[n, labels]`` through ``activation`` ("sigmoid", "softmax", "tanh",
    "identity"); an unknown name is the mesh's fault (the card carried it)."""
    x = logits.astype(np.float64)
    if activation == "sigmoid":
        out = 0.5 * (1.0 + np.tanh(0.5 * x))  # the logistic function without exp overflow
    elif activation == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        out = e / e.sum(axis=1, keepdims=True)
    elif activation == "tanh":
        out = np.tanh(x)
    elif activation == "identity":
        out = x
    else:
        raise ProtocolViolation(f"unknown score activation {activation!r} in the model card")
    return out.astype(np.float32)

"""What the broker checks of what arrives on its sockets, against the served model's card.

The broker's sockets are a trust boundary: an ingress may run on another host, and a submit
that reached the queue is batched with other clients' work. So the cheap invariants a worker
would otherwise trip on are checked here, once per submit, and a request that breaks one is
answered alone; the worker then trusts what the broker sends it.
"""

from __future__ import annotations

import numpy as np

from proto_msgs import ModelInfo, SubmitRequest
from proto_msgs.small_arrays import least, most

WARNED_PEERS_MAX = 4096  # peers remembered as already warned about; older ones may warn again

# What a model's card promises its clients; two workers serving one name must agree on all of it
# (aliases and the worker count are not promises: the first card's aliases stay).
CARD_FIELDS = (
    "dims",
    "max_input_tokens",
    "vocab_size",
    "pooling",
    "normalize",
    "tokenizer_digest",
    "prompts",  # the ingress puts them before the texts: other prompts, other vectors
    "default_prompt_name",
    "include_prompt",
    "task",  # an embedder and a scorer of one name would answer one request two ways
    "labels",
    "activation",
    "multivector_dims",  # a worker without the head would fail a batch of colbert vectors
    "late_interaction",  # a ColBERT model's markers and lengths: other ones, other vectors
)


def submit_problem(msg: SubmitRequest, info: ModelInfo, lengths: np.ndarray) -> str | None:
    """Why ``msg`` cannot be served by ``info``'s model, said so the client can fix it; None
    when it can. ``lengths`` is ``msg.offsets[1:] - msg.offsets[:-1]``, computed once by the caller.

    The codec already checked the shapes (offsets rise from 0 to len(token_ids), ids >= 0).
    """
    dims = msg.output.dims
    if msg.output.rows == "multivector":
        # The head's width, not the pooled one: past it the worker's batch would fail.
        if info.multivector_dims <= 0:
            return f"model {info.name!r} has no multi-vector head"
        if dims is not None and dims > info.multivector_dims:
            return f"dimensions {dims} is over the model's {info.multivector_dims} per token"
    elif dims is not None and dims > info.dims:
        return f"dimensions {dims} is over the model's {info.dims}; ask for at most {info.dims}"
    # A lexical embedder (bge-m3) gives both; a SPLADE model only sparse weights.
    if (msg.output.kind == "sparse") != (info.task == "sparse") and not info.lexical:
        does = "gives sparse weights only" if info.task == "sparse" else "has no sparse weights"
        return f"model {info.name!r} {does}; output kind {msg.output.kind!r} does not fit it"
    if msg.segment_b_start is not None and info.task != "score":
        return f"model {info.name!r} embeds texts; pairs are for cross-encoders (rerank, predict)"
    skip = msg.output.pool_skip
    if skip and info.include_prompt:
        return "pool_skip is for models whose pooling leaves the prompt out; this one pools it"
    if skip and least(lengths) <= skip:
        return f"pool_skip {skip} leaves no token of a sequence to pool"
    longest = most(lengths)
    if longest > info.max_input_tokens:
        return (
            f"a sequence of {longest} tokens is over the model's limit of "
            f"{info.max_input_tokens}; shorten or truncate it"
        )
    # One pass over the ids; len >= 1 because every sequence holds a token.
    highest = most(msg.token_ids)
    if highest >= info.vocab_size:
        return f"token id {highest} is outside the vocabulary (ids must be below {info.vocab_size})"
    return None


def card_differences(served: ModelInfo, offered: ModelInfo) -> list[str]:
    """The card fields in which ``offered`` differs from the ``served`` card of its name."""
    return [f for f in CARD_FIELDS if getattr(served, f) != getattr(offered, f)]


class PeerWarnings:
    """The peers already warned about, so a misbehaving peer is logged once, not per message.

    Bounded: a flood of fresh identities (any DEALER may connect) forgets the oldest rather than
    grow without end; a forgotten peer may be warned about once more.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = WARNED_PEERS_MAX if limit is None else limit
        self._peers: dict[bytes, None] = {}  # an insertion-ordered set

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, identity: object) -> bool:
        return identity in self._peers

    def first(self, identity: bytes) -> bool:
        """True the first time ``identity`` misbehaves (since it was last forgotten)."""
        if identity in self._peers:
            return False
        if len(self._peers) >= self.limit:
            del self._peers[next(iter(self._peers))]
        self._peers[identity] = None
        return True

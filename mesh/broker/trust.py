"""What the broker checks of its peers beyond one message: cards that must agree, peers warned.

The broker's sockets are a trust boundary. A submit is checked against its model's card by the
same rules the client applied before sending (``proto_msgs.checks.submit_problem``); here are
the rules about workers' cards (two workers serving one name must promise the same) and the
bounded memory of peers already warned about.
"""

from __future__ import annotations

from proto_msgs import ModelInfo

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

"""Several rows per sequence: the mean of the final hidden states over each token span.

What contextualized chunk embeddings (late chunking: one span per chunk of a document that ran
as one sequence) and per-token vectors (TEI's ``/embed_all``: one span per token) are made of;
``proto_msgs.messages`` describes spans on the wire. Vectorized over every span of the batch
(one gather and one ``index_add_``, no Python loop), summed in fp32 whatever the model's dtype.

Inside a CUDA graph (:mod:`.gpu`) shapes are fixed per token bucket of ``rows`` rows: disjoint
non-empty spans number at most ``rows``, so a bucket's span rows are ``rows`` slots plus a spare
one that every token outside a span (padding, special tokens, batch-mates) adds into and that
is never read, the trick :func:`.pooling.static_pool` uses for sequences. The host writes the
token-to-slot map and the slots' inverse lengths (:func:`fill_span_index`); the graph runs
:func:`static_span_means`, one ``index_add_`` and one multiply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def absolute_spans(spans: np.ndarray, span_offsets: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 ``[S, 2]``: spans relative to their sequence (as the wire has them) moved to
    positions in the packed batch, whose sequence ``i`` starts at ``offsets[i]``."""
    counts = np.diff(span_offsets.astype(np.int64))
    seq = np.repeat(np.arange(len(counts)), counts)
    return spans.astype(np.int64) + offsets[:-1].astype(np.int64)[seq, None]


def _span_tokens(spans: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every spanned token's position, the span it belongs to, and each span's length."""
    starts = spans[:, 0].astype(np.int64)
    lengths = spans[:, 1].astype(np.int64) - starts
    before = np.cumsum(lengths) - lengths  # each span's first slot among the gathered tokens
    tokens = np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))
    owner = np.repeat(np.arange(spans.shape[0]), lengths)
    return tokens, owner, lengths


def span_means(hidden: torch.Tensor, spans: np.ndarray) -> torch.Tensor:
    """``float32 [S, H]``: row ``s`` is the mean of ``hidden[spans[s, 0]:spans[s, 1]]``.

    ``spans``: int ``[S, 2]`` of positions in ``hidden: [T, H]``, each non-empty (the codec
    checked it: in order, disjoint, inside their sequence). The token-to-span map is built on
    the host, where the spans are, and copied once."""
    count = spans.shape[0]
    width = hidden.shape[1]
    if count == 0:
        return torch.zeros(0, width, dtype=torch.float32, device=hidden.device)
    tokens, owner, lengths = _span_tokens(spans)
    device = hidden.device
    tokens_t = torch.from_numpy(tokens).to(device, non_blocking=True)
    owner_t = torch.from_numpy(owner).to(device, non_blocking=True)
    sums = torch.zeros(count, width, dtype=torch.float32, device=device)
    sums.index_add_(0, owner_t, hidden.index_select(0, tokens_t).float())
    return sums / torch.from_numpy(lengths).to(device, torch.float32)[:, None]


@dataclass
class SpanBuffers:
    """What :func:`static_span_means` reads besides the hidden states, for ``rows`` rows:

    - ``slot``: int64 ``[rows]``, the span slot each row adds into; ``rows`` (the spare slot)
      for a row in no span;
    - ``scale``: float32 ``[rows + 1]``, 1 / length of each slot's span, 0 past the last span
      and on the spare slot.
    """

    slot: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def empty(
        cls, rows: int, device: torch.device | None = None, pin_memory: bool = False
    ) -> SpanBuffers:
        return cls(
            torch.zeros(rows, dtype=torch.int64, device=device, pin_memory=pin_memory),
            torch.zeros(rows + 1, dtype=torch.float32, device=device, pin_memory=pin_memory),
        )

    def head(self, rows: int) -> SpanBuffers:
        """Views of the first entries, as many as a ``rows``-row bucket reads."""
        return SpanBuffers(self.slot[:rows], self.scale[: rows + 1])

    def copy_(self, src: SpanBuffers) -> None:
        """Asynchronous copies of ``src`` (pinned host buffers of the same sizes) into these."""
        self.slot.copy_(src.slot, non_blocking=True)
        self.scale.copy_(src.scale, non_blocking=True)


def fill_span_index(spans: np.ndarray, slot: np.ndarray, scale: np.ndarray) -> bool:
    """Write :func:`static_span_means`' inputs for ``spans`` (int ``[S, 2]``, positions in the
    batch) into host arrays ``slot`` (int64 ``[rows]``) and ``scale`` (float32 ``[rows + 1]``).

    False, with the arrays left in any state, when the spans cannot share one slot map: not
    in order, overlapping, empty, or past ``rows``. The wire's spans never are (the codec
    checks them), but ``span_means`` takes any, so such a batch runs eagerly instead."""
    rows = slot.shape[0]
    count = spans.shape[0]
    if count:
        starts, ends = spans[:, 0].astype(np.int64), spans[:, 1].astype(np.int64)
        if starts[0] < 0 or ends[-1] > rows or (ends <= starts).any():
            return False
        if (starts[1:] < ends[:-1]).any():  # out of order or overlapping
            return False
    slot[:] = rows
    scale[:] = 0.0
    if count:
        tokens, owner, lengths = _span_tokens(spans)
        slot[tokens] = owner
        scale[:count] = 1.0 / lengths
    return True


def span_index(spans: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``fill_span_index`` into new arrays: (slot ``[rows]``, scale ``[rows + 1]``), or None."""
    slot = np.empty(rows, dtype=np.int64)
    scale = np.empty(rows + 1, dtype=np.float32)
    return (slot, scale) if fill_span_index(spans, slot, scale) else None


def static_span_means(hidden: torch.Tensor, bufs: SpanBuffers) -> torch.Tensor:
    """``float32 [rows + 1, H]``: slot ``s < S`` equals ``span_means(hidden, spans)[s]`` for
    the spans ``bufs`` was filled from; later slots are 0, the spare one is never read.
    Shapes are fixed by ``hidden: [rows, H]`` and nothing synchronizes with the host, so a
    graph captures it."""
    slots, width = bufs.scale.shape[0], hidden.shape[1]
    sums = torch.zeros(slots, width, dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, bufs.slot, hidden.float())
    return sums.mul_(bufs.scale[:, None])

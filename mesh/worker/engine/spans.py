"""Several rows per sequence: the mean of the final hidden states over each token span.

What contextualized chunk embeddings (late chunking: one span per chunk of a document that ran
as one sequence) and per-token vectors (TEI's ``/embed_all``: one span per token) are made of;
``proto_msgs.messages`` describes spans on the wire. Vectorized over every span of the batch
(one gather and one ``index_add_``, no Python loop), summed in fp32 whatever the model's dtype.
"""

from __future__ import annotations

import numpy as np
import torch


def absolute_spans(spans: np.ndarray, span_offsets: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 ``[S, 2]``: spans relative to their sequence (as the wire has them) moved to
    positions in the packed batch, whose sequence ``i`` starts at ``offsets[i]``."""
    counts = np.diff(span_offsets.astype(np.int64))
    seq = np.repeat(np.arange(len(counts)), counts)
    return spans.astype(np.int64) + offsets[:-1].astype(np.int64)[seq, None]


def span_means(hidden: torch.Tensor, spans: np.ndarray) -> torch.Tensor:
    """``float32 [S, H]``: row ``s`` is the mean of ``hidden[spans[s, 0]:spans[s, 1]]``.

    ``spans``: int ``[S, 2]`` of positions in ``hidden: [T, H]``, each non-empty (the codec
    checked it: in order, disjoint, inside their sequence). The token-to-span map is built on
    the host, where the spans are, and copied once."""
    count = spans.shape[0]
    width = hidden.shape[1]
    if count == 0:
        return torch.zeros(0, width, dtype=torch.float32, device=hidden.device)
    starts = spans[:, 0].astype(np.int64)
    lengths = spans[:, 1].astype(np.int64) - starts
    before = np.cumsum(lengths) - lengths  # each span's first slot among the gathered tokens
    tokens = np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))
    owner = np.repeat(np.arange(count), lengths)
    device = hidden.device
    tokens_t = torch.from_numpy(tokens).to(device, non_blocking=True)
    owner_t = torch.from_numpy(owner).to(device, non_blocking=True)
    sums = torch.zeros(count, width, dtype=torch.float32, device=device)
    sums.index_add_(0, owner_t, hidden.index_select(0, tokens_t).float())
    return sums / torch.from_numpy(lengths).to(device, torch.float32)[:, None]

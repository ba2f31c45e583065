"""Span rows as a CUDA graph computes them (a token-to-slot map and inverse lengths for a
bucket of fixed rows, one ``index_add_``) equal :func:`span_means` on the real rows, whatever
the bucket's padding rows and stale staging buffers hold. Pure torch, so it runs on CPU;
tests/gpu/test_spans_gpu.py covers it inside real graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.heads.spans import (
    SpanBuffers,
    absolute_spans,
    fill_span_index,
    span_index,
    span_means,
    static_span_means,
)


def _stale(bufs: SpanBuffers) -> None:
    # Values left from an earlier batch: every one the graph reads must be overwritten.
    bufs.slot.fill_(3)
    bufs.scale.fill_(7.0)


def _static_rows(hidden: torch.Tensor, spans: np.ndarray) -> torch.Tensor:
    """What a replay returns: the slots of a bucket of ``hidden``'s rows, staged through
    stale buffers sized for a larger bucket."""
    rows = hidden.shape[0]
    staging = SpanBuffers.empty(4 * rows)
    _stale(staging)
    host = staging.head(rows)
    assert fill_span_index(spans, host.slot.numpy(), host.scale.numpy())
    device = SpanBuffers.empty(rows)
    _stale(device)
    device.copy_(host)
    out = static_span_means(hidden, device)
    assert out.shape == (rows + 1, hidden.shape[1]) and out.dtype == torch.float32
    # Slots past the last span stay 0: a smaller batch after a larger one reads nothing stale.
    assert not out[spans.shape[0] : rows].any()
    return out[: spans.shape[0]]


def _random_layout(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """A batch as the wire allows it: (offsets, absolute spans, bucket rows). Sequences of
    other requests have no spans; a span sequence has at least one, in order and disjoint."""
    lengths = rng.integers(1, 40, size=int(rng.integers(1, 7)))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    spans, counts = [], []
    for length in lengths:
        if rng.random() < 0.3:  # a batch-mate asking for pooled rows
            counts.append(0)
            continue
        cuts = np.unique(rng.integers(0, length + 1, size=int(rng.integers(2, length + 3))))
        if len(cuts) < 2:
            cuts = np.array([0, length])
        pairs = [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if rng.random() < 0.8]
        pairs = pairs or [(cuts[0], cuts[1])]
        spans += pairs
        counts.append(len(pairs))
    relative = np.array(spans, dtype=np.int32).reshape(-1, 2)
    span_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    total = int(offsets[-1])
    rows = total + int(rng.integers(0, 20))  # the bucket's padding rows
    return offsets, absolute_spans(relative, span_offsets, offsets), rows


def test_each_token_maps_to_its_span_and_every_other_row_to_the_spare_slot() -> None:
    index = span_index(np.array([[1, 3], [3, 4], [6, 8]]), rows=10)
    assert index is not None
    slot, scale = index
    np.testing.assert_array_equal(slot, [10, 0, 0, 1, 10, 10, 2, 2, 10, 10])
    np.testing.assert_array_equal(scale, [0.5, 1.0, 0.5] + [0.0] * 8)
    assert slot.dtype == np.int64 and scale.dtype == np.float32


def test_a_batch_without_spans_sends_every_row_to_the_spare_slot() -> None:
    index = span_index(np.zeros((0, 2), dtype=np.int64), rows=5)
    assert index is not None
    np.testing.assert_array_equal(index[0], [5] * 5)
    assert not index[1].any()
    hidden = torch.randn(5, 4, dtype=torch.bfloat16)
    assert _static_rows(hidden, np.zeros((0, 2), dtype=np.int64)).shape == (0, 4)


@pytest.mark.parametrize(
    "spans",
    [
        [[0, 3], [2, 4]],  # overlapping
        [[4, 5], [0, 2]],  # out of order
        [[0, 2], [2, 2]],  # empty
        [[0, 2], [5, 11]],  # past the bucket's rows
        [[-1, 2]],
    ],
)
def test_spans_that_cannot_share_one_slot_map_are_refused(spans: list[list[int]]) -> None:
    assert span_index(np.array(spans), rows=10) is None


@pytest.mark.parametrize(
    ("lengths", "relative", "per_seq", "pad"),
    [
        # Late chunking: [CLS] and [SEP] outside every chunk; a batch-mate without spans.
        ([12, 5], [[1, 4], [4, 9], [9, 11]], [3, 0], 3),
        # Per-token vectors filling the bucket exactly: no padding row, S == rows.
        ([4, 3], [[0, 1], [1, 2], [2, 3], [3, 4], [0, 1], [1, 2], [2, 3]], [4, 3], 0),
        # One span over a whole one-sequence bucket.
        ([16], [[0, 16]], [1], 0),
        # A one-token sequence.
        ([1, 6], [[0, 1], [2, 6]], [1, 1], 9),
    ],
)
def test_static_span_means_equal_span_means_on_chosen_layouts(
    lengths: list[int], relative: list[list[int]], per_seq: list[int], pad: int
) -> None:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    span_offsets = np.concatenate([[0], np.cumsum(per_seq)]).astype(np.int32)
    spans = absolute_spans(np.array(relative, dtype=np.int32), span_offsets, offsets)
    total = int(offsets[-1])
    hidden = torch.randn(total + pad, 8, dtype=torch.float64).to(torch.bfloat16)
    hidden[total:] = float("nan")  # padding rows: only the spare slot ever adds them
    expected = span_means(hidden[:total], spans)
    torch.testing.assert_close(_static_rows(hidden, spans), expected, atol=1e-6, rtol=1e-6)


def test_static_span_means_equal_span_means_on_random_wire_layouts() -> None:
    for seed in range(300):
        rng = np.random.default_rng(seed)
        offsets, spans, rows = _random_layout(rng)
        total = int(offsets[-1])
        gen = torch.Generator().manual_seed(seed)
        dtype = torch.bfloat16 if seed % 2 else torch.float32
        hidden = torch.randn(rows, 6, generator=gen, dtype=torch.float64).to(dtype)
        hidden[total:] = float("nan")
        got = _static_rows(hidden, spans)
        expected = span_means(hidden[:total], spans)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6, msg=f"seed {seed}")

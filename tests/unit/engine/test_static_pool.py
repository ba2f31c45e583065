"""The pooling captured inside a CUDA graph (fixed shapes per bucket) equals the eager
pooling of the real rows, whatever garbage the bucket's padding rows and stale buffers hold.
Pure torch, so it runs on CPU; tests/gpu covers it inside real graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.heads.pooling import PoolBuffers, fill_pool_indices, pool, static_pool

SPECS = [
    "mean",
    "cls",
    "last",
    "max",
    "mean_sqrt_len",
    "weightedmean",
    "cls+max+mean",
    "mean+mean_sqrt_len",
    "cls+last+weightedmean",
]


def _stale(bufs: PoolBuffers) -> None:
    # Values left from an earlier batch: every one the graph reads must be overwritten.
    bufs.index.fill_(-1)
    bufs.pick.fill_(-1)
    bufs.scale.fill_(7.0)
    bufs.weight.fill_(7.0)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(
    ("lengths", "skips"),
    [
        ([1], None),
        ([3, 1, 7], None),
        ([5] * 16, None),
        ([3, 1, 7], [2, 0, 4]),
        ([5] * 16, [1] * 16),
    ],
)
def test_static_pool_equals_pool_on_the_real_rows(spec, lengths, skips) -> None:
    rows, slots, hidden_size = 128, 16, 12
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    gen = torch.Generator().manual_seed(len(lengths))
    hidden = torch.randn(rows, hidden_size, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    hidden[total:] = float("nan")  # padding rows: never read into a real slot
    lens = np.diff(offsets)
    seg = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    # The staging buffers are sized for the largest bucket; a graph reads the head of them.
    staging = PoolBuffers.empty(spec, 4 * rows, 4 * slots)
    _stale(staging)
    host = staging.head(spec, rows, slots)
    skip = None if skips is None else np.array(skips, dtype=np.int64)
    fill_pool_indices(spec, seg, offsets, lens, host, rows, slots, skip)
    device_side = PoolBuffers.empty(spec, rows, slots)
    device_side.copy_(host)
    got = static_pool(hidden, device_side, spec, slots)
    skip_t = None if skip is None else torch.from_numpy(skip)
    want = pool(hidden[:total], torch.from_numpy(offsets), spec, skip_t)
    n = len(lengths)
    assert got.dtype == torch.float32
    assert got.shape == (slots, hidden_size * len(spec.split("+")))
    torch.testing.assert_close(got[:n], want, rtol=1e-6, atol=1e-6)
    assert not torch.isnan(got[:n]).any()


def test_buffers_a_spec_does_not_read_are_empty() -> None:
    sizes = PoolBuffers.sizes("cls", rows=64, slots=8)
    assert sizes == {"index": 0, "pick": 8, "scale": 0, "weight": 0}
    sizes = PoolBuffers.sizes("last+weightedmean", rows=64, slots=8)
    assert sizes == {"index": 64, "pick": 8, "scale": 9, "weight": 64}


@pytest.mark.parametrize("spec", ["mean", "weightedmean", "max", "cls", "last", "mean_sqrt_len"])
def test_skipped_tokens_are_left_out_as_if_the_sequence_started_after_them(spec: str) -> None:
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 6, generator=gen)
    got = pool(hidden, torch.tensor([0, 4, 9]), spec, torch.tensor([1, 3]))
    kept = [hidden[1:4], hidden[7:9]]
    for row, seq, start in zip(got, kept, (1, 3), strict=True):
        weights = torch.arange(start + 1, start + 1 + len(seq), dtype=torch.float32)[:, None]
        want = {
            "mean": seq.mean(0),
            "mean_sqrt_len": seq.sum(0) / len(seq) ** 0.5,
            # sentence-transformers keeps the kept tokens' original position weights
            "weightedmean": (seq * weights).sum(0) / weights.sum(),
            "max": seq.max(0).values,
            "cls": seq[0],
            "last": seq[-1],
        }[spec]
        torch.testing.assert_close(row, want)

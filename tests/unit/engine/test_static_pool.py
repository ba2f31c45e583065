"""The pooling captured inside a CUDA graph (fixed shapes per bucket) equals the eager
pooling of the real rows, whatever garbage the bucket's padding rows and stale buffers hold.
Pure torch, so it runs on CPU; tests/gpu covers it inside real graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.pooling import PoolBuffers, fill_pool_indices, pool, static_pool

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
@pytest.mark.parametrize("lengths", [[1], [3, 1, 7], [5] * 16])
def test_static_pool_equals_pool_on_the_real_rows(spec: str, lengths: list[int]) -> None:
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
    fill_pool_indices(spec, seg, offsets, lens, host, rows, slots)
    device_side = PoolBuffers.empty(spec, rows, slots)
    device_side.copy_(host)
    got = static_pool(hidden, device_side, spec, slots)
    want = pool(hidden[:total], torch.from_numpy(offsets), spec)
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

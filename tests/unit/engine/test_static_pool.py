"""The pooling captured inside a CUDA graph (fixed shapes per bucket) equals the eager
pooling of the real rows, whatever garbage the bucket's padding rows hold. Pure torch, so
it runs on CPU; tests/gpu covers it inside real graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.gpu import fill_pool_indices, static_pool
from mesh.worker.engine.pooling import pool


@pytest.mark.parametrize("mode", ["mean", "cls", "last"])
@pytest.mark.parametrize("lengths", [[1], [3, 1, 7], [5] * 16])
def test_static_pool_equals_pool_on_the_real_rows(mode: str, lengths: list[int]) -> None:
    rows, slots, hidden_size = 128, 16, 12
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    gen = torch.Generator().manual_seed(len(lengths))
    hidden = torch.randn(rows, hidden_size, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    hidden[total:] = float("nan")  # padding rows: never read into a real slot
    lens = np.diff(offsets)
    seg = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    index = np.full(rows, -1, dtype=np.int64)  # stale values must all be overwritten
    inv = np.full(slots + 1, 7.0, dtype=np.float32)
    used = fill_pool_indices(mode, seg, offsets, lens, index, inv, rows)
    got = static_pool(hidden, torch.from_numpy(index[:used]), torch.from_numpy(inv), mode, slots)
    want = pool(hidden[:total], torch.from_numpy(offsets), mode)
    n = len(lengths)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[:n], want, rtol=1e-6, atol=1e-6)
    if mode == "mean":
        assert got.shape == (slots + 1, hidden_size)
        assert torch.isnan(got[slots]).all() and not torch.isnan(got[:n]).any()
    else:
        assert got.shape == (slots, hidden_size)

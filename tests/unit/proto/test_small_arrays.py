"""proto_msgs.small_arrays answers as numpy does on both sides of its size cut."""

from __future__ import annotations

import numpy as np
import pytest

from proto_msgs.small_arrays import SMALL, bounds, least, most


@pytest.mark.parametrize("n", [1, 2, SMALL, SMALL + 1, 3 * SMALL])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64])
def test_reductions_match_numpy(n: int, dtype: type) -> None:
    rng = np.random.default_rng(n)
    low = 0 if dtype == np.uint64 else -(2**30)
    values = rng.integers(low, 2**30, size=n).astype(dtype)
    values[n // 2] = np.iinfo(dtype).max  # the extremes survive as exact Python ints
    values[0] = np.iinfo(dtype).min
    assert bounds(values) == (int(values.min()), int(values.max()))
    assert least(values) == int(values.min())
    assert most(values) == int(values.max())
    assert all(type(x) is int for x in (*bounds(values), least(values), most(values)))

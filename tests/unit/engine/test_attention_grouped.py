"""The grouped SDPA backend (CUDA's for masked families) against the per-sequence one: the same
outputs for every mask the families use (MPNet's bias, windows, causal, grouped-query heads,
ColBERT's key counts), over batches whose lengths force several groups and padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.kernels.attention import SdpaPerSequence
from mesh.worker.engine.kernels.attention_grouped import NO_CUDNN, SdpaGrouped

LENGTHS = [1, 3, 7, 8, 16, 17, 40, 41, 5, 64, 2, 33]


def _batch(hq: int, hkv: int, d: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(LENGTHS)
    q = torch.randn(total, hq, d, generator=gen)
    k = torch.randn(total, hkv, d, generator=gen)
    v = torch.randn(total, hkv, d, generator=gen)
    cu = torch.tensor(np.cumsum([0, *LENGTHS]), dtype=torch.int32)
    return q, k, v, cu


@pytest.mark.parametrize(
    ("causal", "window", "with_bias", "hkv"),
    [(False, None, False, 4), (False, 4, False, 4), (False, None, True, 4),
     (True, None, False, 2), (True, 6, False, 1), (False, 4, True, 4)],
)  # fmt: skip
def test_grouped_equals_per_sequence(causal: bool, window: int | None, with_bias: bool, hkv: int):
    q, k, v, cu = _batch(4, hkv)
    bias = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(1)) if with_bias else None
    want, got = SdpaPerSequence(), SdpaGrouped(max_group_tokens=96, waste=1.3)
    want.plan(cu, causal, scale=0.3)
    got.plan(cu, causal, scale=0.3)
    assert len(got._groups) > 2  # several groups, with padding
    for _ in range(2):  # a second layer reuses the cached masks
        expected = want.run(q, k, v, bias=bias, window=window)
        actual = got.run(q, k, v, bias=bias, window=window)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert not torch.isnan(actual).any()


def test_key_counts_leave_the_tail_out_as_the_per_sequence_backend_does():
    q, k, v, cu = _batch(2, 2)
    keys = np.array([max(1, n - 2) for n in LENGTHS])
    want, got = SdpaPerSequence(), SdpaGrouped(max_group_tokens=128)
    want.plan(cu, False, keys=keys)
    got.plan(cu, False, keys=keys)
    torch.testing.assert_close(got.run(q, k, v), want.run(q, k, v), rtol=1e-5, atol=1e-5)


def test_a_batch_of_one_sequence_and_empty_sequences():
    q, k, v, _ = _batch(2, 2)
    cu = torch.tensor([0, 0, 5, 5], dtype=torch.int32)
    want, got = SdpaPerSequence(), SdpaGrouped()
    want.plan(cu, True)
    got.plan(cu, True)
    torch.testing.assert_close(got.run(q[:5], k[:5], v[:5]), want.run(q[:5], k[:5], v[:5]))


def test_a_group_moves_to_the_device_in_one_packed_copy_unchanged():
    _, _, _, cu = _batch(2, 2)
    backend = SdpaGrouped(max_group_tokens=96)
    backend.plan(cu, False, keys=np.array([max(1, n - 1) for n in LENGTHS]))
    for g in backend._groups:
        moved = g.to(torch.device("cpu"))  # the same packing as to CUDA
        for name in ("index", "valid", "keys", "dest", "flat"):
            got, want = getattr(moved, name), getattr(g, name)
            assert got.dtype == want.dtype and torch.equal(got, want), name
        # The integer positions pick exactly the valid slots, in the same order.
        assert torch.equal(g.flat, torch.nonzero(g.valid.reshape(-1)).reshape(-1))


@pytest.mark.parametrize("backends", [NO_CUDNN, None])
def test_grouped_sdpa_leaves_cudnn_out_unless_told_otherwise(
    backends: tuple | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cuDNN builds a graph per new shape, and grouped SDPA's shapes are new in nearly every
    # batch (attention_grouped.NO_CUDNN): by default every group's SDPA runs without it.
    seen: list[bool] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v, cu = _batch(4, 4)
    grouped = SdpaGrouped(max_group_tokens=96, waste=1.3)
    grouped.backends = backends
    grouped.plan(cu, False)
    grouped.run(q, k, v)
    assert len(seen) == len(grouped._groups) > 1
    assert set(seen) == {backends is None}  # torch's own choice keeps cuDNN enabled
    assert torch.backends.cuda.cudnn_sdp_enabled()  # and the global switch is restored

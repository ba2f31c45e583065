"""finalize: Matryoshka truncation, normalization and the wire number formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.outputs import finalize


@pytest.fixture
def pooled() -> torch.Tensor:
    return torch.randn(5, 48, generator=torch.Generator().manual_seed(3)) * 3.0


def test_float32_without_normalization_is_the_pooled_vector(pooled: torch.Tensor) -> None:
    out = finalize(pooled, None, False, "float32")
    assert out.dtype == np.float32 and out.shape == (5, 48)
    np.testing.assert_array_equal(out, pooled.numpy())


def test_truncation_keeps_the_first_dims_and_renormalizes(pooled: torch.Tensor) -> None:
    out = finalize(pooled, 16, True, "float32")
    assert out.shape == (5, 16)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    head = pooled[:, :16].numpy()
    expected = head / np.linalg.norm(head, axis=1, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [None, 48, 16])
def test_normalization_is_torch_normalize_bit_for_bit(
    pooled: torch.Tensor, dims: int | None, dtype: torch.dtype
) -> None:
    # A zero vector stays zero; one whose norm is under F.normalize's eps is divided by the
    # eps, so only the same eps gives the same bits.
    rows = torch.cat([pooled, torch.zeros(1, 48), torch.full((1, 48), 1e-15)]).to(dtype)
    out = finalize(rows, dims, True, "float32")
    expected = torch.nn.functional.normalize(rows.float()[:, : dims or 48], p=2.0, dim=1)
    np.testing.assert_array_equal(out, expected.numpy())


def test_truncation_without_normalization_only_cuts(pooled: torch.Tensor) -> None:
    out = finalize(pooled, 7, False, "float32")
    np.testing.assert_array_equal(out, pooled[:, :7].numpy())


def test_float16_is_the_float32_result_rounded(pooled: torch.Tensor) -> None:
    out = finalize(pooled, 32, True, "float16")
    assert out.dtype == np.float16 and out.shape == (5, 32)
    np.testing.assert_array_equal(out, finalize(pooled, 32, True, "float32").astype(np.float16))


def test_int8_is_symmetric_per_vector_absmax_scaling(pooled: torch.Tensor) -> None:
    out = finalize(pooled, None, True, "int8")
    assert out.dtype == np.int8 and out.shape == (5, 48)
    x = finalize(pooled, None, True, "float32").astype(np.float64)
    expected = np.round(x * 127.0 / np.abs(x).max(axis=1, keepdims=True))
    np.testing.assert_array_equal(out, expected.astype(np.int8))
    # The largest component of each vector maps to +-127, and -128 never appears.
    assert (np.abs(out.astype(np.int16)).max(axis=1) == 127).all()
    assert out.min() >= -127
    # Up to the unsent per-vector scale, the vector's direction survives.
    cos = (out * x).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(x, axis=1))
    assert cos.min() > 0.999


def test_int8_of_a_zero_vector_is_zeros() -> None:
    out = finalize(torch.zeros(2, 8), None, True, "int8")
    np.testing.assert_array_equal(out, np.zeros((2, 8), dtype=np.int8))


def test_binary_packs_the_sign_bits_most_significant_first(pooled: torch.Tensor) -> None:
    for dims in (48, 13, 8, 1):
        out = finalize(pooled, dims, True, "binary")
        assert out.dtype == np.uint8 and out.shape == (5, (dims + 7) // 8)
        x = pooled[:, :dims].numpy()
        np.testing.assert_array_equal(out, np.packbits(x > 0, axis=-1))


def test_binary_bit_order_by_hand() -> None:
    x = torch.tensor([[1.0, -1.0, 0.0, 2.0, -3.0, -3.0, -3.0, 5.0, 7.0, -1.0]])
    # components 0, 3, 7 positive -> 0b10010001; then 8 positive -> 0b10000000 (zero-padded).
    # 0.0 is not > 0, so it is a 0 bit.
    np.testing.assert_array_equal(finalize(x, None, False, "binary"), [[0b10010001, 0b10000000]])


@pytest.mark.parametrize("dims", [0, -1, 49, 1000])
def test_dims_outside_one_to_d_are_refused(pooled: torch.Tensor, dims: int) -> None:
    with pytest.raises(ValueError, match="dims"):
        finalize(pooled, dims, True, "float32")


def test_an_unknown_output_kind_is_refused(pooled: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="kind"):
        finalize(pooled, None, True, "bfloat16")

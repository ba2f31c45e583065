"""The window mask FlashInfer gets for a windowed model's long batches (built on the device
in one pass, here on the CPU): each sequence's ``l x l`` block, row-major, in batch order,
is exactly the window that ``sequence_mask`` (and grouped SDPA) apply, bidirectional and
causal, for sequences shorter than, at and past the window; and which models get that
backend (one window size, a head_dim FlashInfer was checked on, not switched off)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import bare_model

from mesh.worker.engine.kernels import flashinfer_windowed
from mesh.worker.engine.kernels.attention import sequence_mask
from mesh.worker.engine.kernels.flashinfer_windowed import (
    WINDOW_MASK_ENV,
    band_mask,
    windowed_backend,
)
from mesh.worker.engine.models.base import PackedEncoder


def _expected(n: int, window: int, causal: bool) -> torch.Tensor:
    """``sequence_mask``'s limits for one sequence as a full ``[n, n]`` boolean."""
    mask = sequence_mask(n, causal, None, window, torch.device("cpu"))
    if mask is not None:
        return mask[0, 0]
    full = torch.ones(n, n, dtype=torch.bool)
    # None: nothing cuts the sequence, except causality (SDPA's is_causal) when causal.
    return full.tril() if causal else full


def _blocks(lengths: list[int], window: int, causal: bool) -> list[torch.Tensor]:
    lens = torch.tensor(lengths, dtype=torch.int64)
    size = sum(n * n for n in lengths)
    flat = band_mask(lens, sum(lengths), size, window, causal)
    assert flat.dtype == torch.bool and flat.shape == (size,)
    return [
        b.view(n, n) for b, n in zip(flat.split([n * n for n in lengths]), lengths, strict=True)
    ]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("window", [0, 1, 3, 8, 64])
def test_each_sequence_block_is_the_sdpa_window_mask(window: int, causal: bool) -> None:
    # Below, at and past the mask-free bound (window + 1), and far past it.
    lengths = [1, 2, window, window + 1, window + 2, 3 * window + 5, 7, 1, 2 * window + 9]
    lengths = [n for n in lengths if n > 0]
    for n, block in zip(lengths, _blocks(lengths, window, causal), strict=True):
        assert torch.equal(block, _expected(n, window, causal)), (n, window, causal)


def test_a_sequence_past_the_window_has_a_band() -> None:
    (block,) = _blocks([6], 1, False)
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 1, 1, 1],
            [0, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block, expected)
    (causal,) = _blocks([6], 1, True)
    assert torch.equal(causal, expected.tril())


def test_the_mask_is_empty_for_an_empty_batch_sequence() -> None:
    # An empty sequence (graph padding elsewhere) takes no elements and shifts nothing.
    blocks = _blocks([3, 0, 4], 1, False)
    assert [b.shape for b in blocks] == [(3, 3), (0, 0), (4, 4)]
    assert torch.equal(blocks[2], _expected(4, 1, False))


class _Biased(PackedEncoder):
    position_bias = True  # as MPNet


def _model(windows: list[int | None], bias: bool = False) -> PackedEncoder:
    return bare_model(_Biased if bias else PackedEncoder, tuple(windows))


def test_a_model_with_one_window_size_has_that_window() -> None:
    assert _model([None, 64, 64, None, 64]).single_window == 64


def test_models_without_one_window_size_keep_grouped_sdpa() -> None:
    assert _model([None, 64, 32]).single_window is None  # a mask per size: not built
    assert _model([None, None]).single_window is None
    assert _model([None], bias=True).single_window is None  # MPNet: a bias


@pytest.mark.parametrize(
    ("choice", "head_dim", "model"),
    [
        ("sdpa", 64, _model([None, 64])),  # switched off
        ("flashinfer", 96, _model([None, 64])),  # a head_dim FlashInfer was not checked on
        ("flashinfer", 64, _model([None, 64, 32])),
    ],
)
def test_the_windowed_backend_is_not_built_where_it_does_not_apply(
    choice: str, head_dim: int, model: PackedEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WINDOW_MASK_ENV, choice)
    heads = (8, 8, head_dim)
    # No flashinfer here: building it would fail, so None means nothing was built.
    assert windowed_backend(model, heads, torch.bfloat16, torch.device("cpu")) is None


def test_an_unknown_window_mask_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WINDOW_MASK_ENV, "flash")
    with pytest.raises(ValueError, match=WINDOW_MASK_ENV):
        windowed_backend(_model([None, 64]), (8, 8, 64), torch.bfloat16, torch.device("cpu"))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_windowed_backend_is_built_for_one_window_at_a_served_head_dim(
    head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FlashInfer is not here: a stand-in records what would have been built.
    built: list[tuple] = []
    monkeypatch.setattr(
        flashinfer_windowed,
        "FlashInferWindowed",
        lambda heads, dtype, device, window, workspace: built.append((heads, window)) or "built",
    )
    monkeypatch.delenv(WINDOW_MASK_ENV, raising=False)  # the default: flashinfer
    heads = (8, 2, head_dim)
    assert windowed_backend(_model([None, 64, 64]), heads, torch.bfloat16, torch.device("cpu"))
    assert built == [(heads, 64)]

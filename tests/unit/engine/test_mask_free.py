"""Which batches of a windowed model need no mask: a window of ``w`` keys either side changes
nothing for a sequence of at most ``w + 1`` tokens, so such a batch runs the mask-free path
(on CUDA FlashInfer and the graphs). The bound per family from its config, at the boundary;
MPNet's bias never; and a backend drops a window only when told the batch is covered."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import MaskFreeSdpa, bare_model

from mesh.worker.engine.kernels.attention import (
    SdpaPerSequence,
    mask_free,
    mask_free_length,
    sequence_mask,
)
from mesh.worker.engine.models import gemma3, modernbert
from mesh.worker.engine.models.mpnet import MPNetEncoder


@pytest.mark.parametrize(
    ("name", "window", "longest_free"),
    [
        # ModernBERT-base: local_attention 128, 64 either side.
        ("modernbert", modernbert._window({"local_attention": 128}), 65),
        # EmbeddingGemma: sliding_window 512 as saved, 256 either side.
        ("gemma3 bidirectional", gemma3._window({"sliding_window": 512}, False), 257),
        # A causal Gemma 3: the 512 most recent keys, itself included.
        ("gemma3 causal", gemma3._window({"sliding_window": 512}, True), 512),
    ],
)
def test_a_windowed_batch_is_mask_free_up_to_the_window_plus_one(
    name: str, window: int, longest_free: int
) -> None:
    free = mask_free_length([None, window, window, None])
    assert free == longest_free, name
    assert mask_free(free, True, free)
    assert mask_free(1, True, free)
    assert not mask_free(free + 1, True, free)


def test_an_mpnet_batch_is_never_mask_free() -> None:
    mpnet = bare_model(MPNetEncoder)
    assert mpnet.needs_masks and mpnet.mask_free_length is None
    assert not mask_free(1, True, mpnet.mask_free_length)


def test_a_model_without_masks_is_always_mask_free() -> None:
    assert mask_free(100_000, False, None)


def test_the_smallest_window_bounds_the_mask_free_length() -> None:
    assert mask_free_length([None, 8, 3, None, 8]) == 4
    assert mask_free_length([None, None]) is None


@pytest.mark.parametrize("window", [0, 3, 64])
def test_the_bound_is_where_the_sdpa_mask_starts(window: int) -> None:
    # The same inequality as the masks the SDPA backends build: none up to the bound.
    free = mask_free_length([window])
    assert sequence_mask(free, False, None, window, torch.device("cpu")) is None
    mask = sequence_mask(free + 1, False, None, window, torch.device("cpu"))
    assert mask is not None and not mask.all()


def _qkv(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(n, 2, 8, generator=gen) for _ in range(3))  # type: ignore[return-value]


def test_a_covered_backend_drops_the_window_and_only_it() -> None:
    q, k, v = _qkv(10)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    covered, masked = MaskFreeSdpa(), SdpaPerSequence()
    covered.plan(cu, False)
    masked.plan(cu, False)
    # Every sequence within the window: the same as the masked backend's.
    got = covered.run(q, k, v, window=5)
    torch.testing.assert_close(got, masked.run(q, k, v, window=5), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, masked.run(q, k, v), rtol=1e-6, atol=1e-6)


def test_a_backend_without_masks_still_refuses_a_window_or_a_bias() -> None:
    q, k, v = _qkv(4)

    class NoMasks(SdpaPerSequence):
        takes_bias = False
        takes_window = False

    plain = NoMasks()
    plain.plan(torch.tensor([0, 4], dtype=torch.int32), False)
    with pytest.raises(ValueError, match="NoMasks takes no attention window"):
        plain.run(q, k, v, window=2)
    covered = MaskFreeSdpa()
    covered.plan(torch.tensor([0, 4], dtype=torch.int32), False)
    with pytest.raises(ValueError, match="MaskFreeSdpa takes no attention bias"):
        covered.run(q, k, v, bias=torch.zeros(2, 4, 4))

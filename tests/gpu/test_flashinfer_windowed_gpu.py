"""FlashInferWindowed, the backend of a windowed model's batches that its window cuts: in bf16,
its local layers (the window as FlashInfer's custom mask) and its global ones (plain) against
the CPU path's per-sequence SDPA and grouped SDPA (the path it replaces) in fp32 on the same
inputs, bidirectional and causal, GQA included, over two batches (a re-plan). The head_dim 256
case (EmbeddingGemma's) was the probe that let the runner use it: FlashInfer's fa2 takes it
with a custom mask (passed on the H200, 2026-12-03)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.kernels.attention import SdpaPerSequence
from mesh.worker.engine.kernels.attention_grouped import SdpaGrouped
from mesh.worker.engine.kernels.flashinfer_windowed import FlashInferWindowed

WINDOW = 32
# Shorter than, at and past the mask-free bound (WINDOW + 1), and far past it; then a re-plan.
BATCHES = [[1, 5, 33, 34, 64, 100, 257, 2, 300], [70, 3, 129, 33]]


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm()).item()


def _check(heads: tuple[int, int, int], causal: bool) -> None:
    hq, hkv, d = heads
    attn = FlashInferWindowed(heads, torch.bfloat16, torch.device("cuda"), WINDOW)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for lengths in BATCHES:
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.from_numpy(np.cumsum(lengths))
        total = int(cu[-1])
        q, k, v = (
            torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for h in (hq, hkv, hkv)
        )
        attn.plan(cu, causal)
        refs = {"per sequence": SdpaPerSequence(), "grouped": SdpaGrouped()}
        for ref in refs.values():
            ref.plan(cu, causal)
        for window in (WINDOW, None):  # a local layer, then a global one
            ours = attn.run(q, k, v, window=window)
            assert ours.shape == q.shape and torch.isfinite(ours).all()
            for name, ref in refs.items():
                expected = ref.run(q.float(), k.float(), v.float(), window=window)
                err = _rel_err(ours, expected)
                print(f"{heads} causal={causal} window={window} {lengths} vs {name}: {err:.2e}")
                assert err < 1e-2, (name, window, lengths)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("heads", [(8, 8, 64), (16, 8, 128)], ids=["hd64", "hd128-gqa"])
def test_windowed_flashinfer_matches_sdpa_with_the_window(
    heads: tuple[int, int, int], causal: bool
) -> None:
    _check(heads, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_windowed_flashinfer_probe_head_dim_256(causal: bool) -> None:
    _check((3, 1, 256), causal)  # EmbeddingGemma-300m's heads


def test_windowed_flashinfer_refuses_another_window_and_a_bias() -> None:
    attn = FlashInferWindowed((8, 8, 64), torch.bfloat16, torch.device("cuda"), WINDOW)
    attn.plan(torch.tensor([0, 40], dtype=torch.int32), False)
    q = torch.randn(40, 8, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="window"):
        attn.run(q, q, q, window=WINDOW + 1)
    with pytest.raises(ValueError, match="bias"):
        attn.run(q, q, q, bias=torch.zeros(8, 40, 40, device="cuda"), window=WINDOW)
    with pytest.raises(ValueError, match="keys"):
        attn.plan(torch.tensor([0, 40], dtype=torch.int32), False, keys=np.array([30]))

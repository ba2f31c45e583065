"""The SDPA attention backends (per sequence, and length-sorted padded groups) equal a naive
masked attention over the packed batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mesh.worker.engine.heads.pooling import pool, positions, segment_ids
from mesh.worker.engine.kernels.attention import SdpaPerSequence
from mesh.worker.engine.kernels.attention_grouped import SdpaGrouped

LENGTHS = [1, 5, 17, 2, 64, 3, 33, 1, 100]


def _naive(q, k, v, cu: torch.Tensor, causal: bool) -> torch.Tensor:
    """Dense attention over all T tokens with a block-diagonal (and causal) mask."""
    total, hq, d = q.shape
    seg = segment_ids(cu, total)
    allowed = seg[:, None] == seg[None, :]
    if causal:
        allowed &= torch.ones(total, total, dtype=torch.bool).tril()
    k = k.repeat_interleave(hq // k.shape[1], dim=1)
    v = v.repeat_interleave(hq // v.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("backend", [SdpaPerSequence, SdpaGrouped])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_backend_equals_block_diagonal_attention(backend, causal: bool, kv_heads: int) -> None:
    gen = torch.Generator().manual_seed(kv_heads)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    q = torch.randn(total, 4, 16, generator=gen)
    k = torch.randn(total, kv_heads, 16, generator=gen)
    v = torch.randn(total, kv_heads, 16, generator=gen)
    attn = backend()
    attn.plan(cu, causal)
    torch.testing.assert_close(attn.run(q, k, v), _naive(q, k, v, cu, causal))


def test_positions_restart_at_every_sequence() -> None:
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    assert positions(cu, 8).tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert segment_ids(cu, 8).tolist() == [0, 0, 0, 1, 2, 2, 2, 2]


def test_pooling_over_packed_tokens() -> None:
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    hidden = torch.arange(12, dtype=torch.float16).view(6, 2)
    assert pool(hidden, cu, "cls").tolist() == [[0, 1], [4, 5], [6, 7]]
    assert pool(hidden, cu, "last").tolist() == [[2, 3], [4, 5], [10, 11]]
    assert pool(hidden, cu, "mean").tolist() == [[1, 2], [4, 5], [8, 9]]
    assert pool(hidden, cu, "mean").dtype == torch.float32


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masks", ["bias", "window", "both"])
def test_the_per_sequence_backend_adds_a_relative_bias_and_limits_a_window(
    causal: bool, masks: str
) -> None:
    gen = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    total, longest, window = int(cu[-1]), max(LENGTHS), 4
    q, k, v = (torch.randn(total, 4, 16, generator=gen) for _ in range(3))
    # Relative: bias[h, i, j] depends on j - i only, so a sequence's is the top-left block.
    rel = torch.randn(4, 2 * longest - 1, generator=gen)
    i = torch.arange(longest)
    bias = rel[:, (i[None, :] - i[:, None]) + longest - 1]
    use_bias, use_window = masks in ("bias", "both"), masks in ("window", "both")
    attn = SdpaPerSequence()
    attn.plan(cu, causal)
    ours = attn.run(q, k, v, bias=bias if use_bias else None, window=window if use_window else None)
    seg = segment_ids(cu, total)
    pos = positions(cu, total)
    allowed = seg[:, None] == seg[None, :]
    if causal:
        allowed &= pos[:, None] >= pos[None, :]
    if use_window:
        allowed &= (pos[:, None] - pos[None, :]).abs() <= window
    scores = torch.einsum("qhd,khd->hqk", q, k) / 16**0.5
    if use_bias:
        scores = scores + bias[:, pos[:, None], pos[None, :]]
    scores = scores.masked_fill(~allowed, float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    torch.testing.assert_close(ours, ref)


def test_every_backend_states_what_it_honours() -> None:
    from mesh.worker.engine.kernels import flashinfer_attention, flashinfer_windowed
    from mesh.worker.engine.kernels.attention import DECLARATIONS, AttentionBackend

    backends = [
        SdpaPerSequence,
        SdpaGrouped,
        flashinfer_attention.FlashInferRagged,
        flashinfer_attention.TorchVarlen,
        flashinfer_windowed.FlashInferWindowed,
    ]
    for backend in backends:
        assert issubclass(backend, AttentionBackend)
        assert all(isinstance(getattr(backend, d), bool) for d in DECLARATIONS), backend
    with pytest.raises(TypeError, match="does not declare"):

        class Undeclared(AttentionBackend):  # keys stated, bias and window not
            takes_keys = True


def test_a_backend_refuses_what_it_does_not_take_by_name() -> None:
    class KeysOnly(SdpaPerSequence):
        takes_keys, takes_bias, takes_window = False, False, False

    attn = KeysOnly()
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="KeysOnly takes no keys="):
        attn.plan(cu, False, keys=np.array([2]))
    attn.plan(cu, False)
    q = torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match="KeysOnly takes no attention bias"):
        attn.run(q, q, q, bias=torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="KeysOnly takes no attention window"):
        attn.run(q, q, q, window=1)

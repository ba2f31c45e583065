"""A sparse (SPLADE) model on CUDA in bf16 (eager, FlashInfer attention, the MLM head in bf16,
pooling in fp32) against transformers' ``BertForMaskedLM`` in fp32 on the GPU: the weights of
each text close to the fp32 ones (cosine >= 0.999, the same large entries), and the top-k rows
(on the device) keep what fp32 keeps, but for ties within bf16's rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.cpu import CpuRunner
from mesh.worker.engine.engine import Engine
from tests.st_models import build_splade
from tests.unit.engine.engine_helpers import tokenized

TEXTS = [
    "what does a sparse lexical model expand a query into",
    "CUDA graphs replay a captured sequence of kernels with one launch.",
    "a",
    "SPLADE weighs every vocabulary entry; " * 12,
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64: FlashInfer's fa2 tiling.
    return build_splade(tmp_path_factory.mktemp("gpu-splade") / "splade", hidden=128, heads=2)


def _packed(engine: Engine) -> tuple[np.ndarray, np.ndarray]:
    return tokenized(engine.card.tokenizer_json, TEXTS)


def _reference(model_dir: Path, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    import transformers

    mlm = transformers.BertForMaskedLM.from_pretrained(model_dir, dtype=torch.float32)
    mlm = mlm.to("cuda").eval()
    rows = []
    for i in range(len(offsets) - 1):
        seq = torch.from_numpy(ids[offsets[i] : offsets[i + 1]].astype(np.int64))[None].cuda()
        with torch.no_grad():
            logits = mlm(input_ids=seq).logits[0]
        rows.append(torch.log1p(torch.relu(logits)).amax(dim=0).cpu().numpy())
    return np.stack(rows)


def test_bf16_sparse_weights_match_fp32_masked_lm_on_the_gpu(model_dir: Path) -> None:
    engine = Engine.load(model_dir, device="cuda")
    # Eager, by design: the CPU runner's forward, on the GPU.
    assert engine.dtype == torch.bfloat16 and isinstance(engine.runner, CpuRunner)
    ids, offsets = _packed(engine)
    ours = engine.embed(ids, offsets).cpu().numpy()
    ref = _reference(model_dir, ids, offsets)
    for got, want in zip(ours, ref, strict=True):
        cos = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
        assert cos >= 0.999, cos
        big = want > 0.25 * want.max()
        # Measured on the H200: the bf16 forward and MLM head put a few large weights 5-10 %
        # off fp32 (5 of 1,527 in one run; 1 of 699 at 10.2 %, and 2.0 % of another row's
        # over 5 %, in others; cosine >= 0.999 in all). So: most within 5 %, all within 20 %.
        rel = np.abs(got[big] - want[big]) / want[big]
        assert np.mean(rel <= 0.05) >= 0.95, np.sort(rel)[-10:]
        np.testing.assert_allclose(got[big], want[big], rtol=0.2)
    k = 32
    rows = engine.embed_final(ids, offsets, kind="sparse", top_k=k)
    w = rows.shape[1] // 2  # the most pairs a row kept: at most k
    assert 1 <= w <= k
    for row, want in zip(rows, ref, strict=True):
        kept = row[w:] > 0
        got_ids = row[:w][kept].astype(np.int64)
        assert np.all(np.diff(got_ids) > 0)
        top = np.argsort(want)[::-1][:k]
        # A swap at the k-th place is bf16 rounding; the top half must agree exactly.
        assert set(top[: k // 2]) <= set(got_ids.tolist())

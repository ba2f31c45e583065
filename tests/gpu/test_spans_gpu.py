"""Span rows on CUDA in bf16 (contextualized chunks, per-token vectors): a batch holding spans
runs eagerly and its span rows equal transformers' fp32 hidden states averaged over each span
on the GPU (cos >= 0.999 per row); its pooled rows equal those of the same batch replayed
through the bucket's graph, so ordinary batch-mates lose nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.engine import Engine
from mesh.worker.engine.spans import absolute_spans
from tests.st_models import build_st_model, build_tiny_bert

SEQS = [[101, *range(2000, 2040), 102], [101, *range(3000, 3011), 102], [101, 4000, 102]]
CHUNKS = [[(1, 12), (12, 30), (30, 41)], [(0, 13)], [(0, 1), (1, 2), (2, 3)]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu-spans")
    # head_dim 64: FlashInfer's fa2 tiling.
    bert = build_tiny_bert(root / "bert", hidden=128, heads=2)
    return build_st_model(bert, root / "st", pooling="mean", normalize=False)


def _pack() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array([t for s in SEQS for t in s], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in SEQS])]).astype(np.int32)
    spans = np.array([c for doc in CHUNKS for c in doc], dtype=np.int32)
    span_offsets = np.concatenate([[0], np.cumsum([len(d) for d in CHUNKS])]).astype(np.int32)
    return ids, offsets, absolute_spans(spans, span_offsets, offsets)


def _reference(model_dir: Path) -> torch.Tensor:
    import transformers

    hf = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).to("cuda").eval()
    rows = []
    for seq, chunks in zip(SEQS, CHUNKS, strict=True):
        with torch.no_grad():
            hidden = hf(input_ids=torch.tensor([seq], device="cuda")).last_hidden_state[0]
        rows += [hidden[a:b].mean(0) for a, b in chunks]
    return torch.stack(rows).float()


def test_span_rows_in_bf16_equal_transformers_fp32_and_pooled_rows_equal_the_graphs(
    model_dir: Path,
) -> None:
    engine = Engine.load(model_dir, device="cuda")
    ids, offsets, spans = _pack()
    engine.warmup([len(ids)])
    replayed = engine.embed(ids, offsets)  # through the bucket's graph
    assert engine.runner is not None and engine.runner.graph_batches == 1
    pooled, rows = engine.embed_with_spans(ids, offsets, spans)
    assert engine.runner.eager_batches == 1  # spans never replay a graph
    assert rows.dtype == torch.float32 and rows.shape == (len(spans), 128)
    cos = torch.nn.functional.cosine_similarity(rows, _reference(model_dir), dim=1)
    assert cos.min().item() >= 0.999, cos
    torch.testing.assert_close(pooled, replayed, atol=2e-2, rtol=2e-2)

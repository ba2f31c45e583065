"""Span rows on CUDA in bf16 (contextualized chunks, per-token vectors) against transformers'
fp32 hidden states averaged over each span on the GPU (cos >= 0.999 per row). A bucket's first
span batch runs eagerly and captures the bucket's span graph; later ones replay it and equal the
eager path (a graphs-off engine) row for row, whatever layout the previous replay staged;
spans the graph cannot map (overlapping) still run eagerly; the pooled rows of a span batch
equal those of the plain graph, so ordinary batch-mates lose nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads.spans import absolute_spans
from tests.st_models import build_st_model, build_tiny_bert

SEQS = [[101, *range(2000, 2040), 102], [101, *range(3000, 3011), 102], [101, 4000, 102]]
CHUNKS = [[(1, 12), (12, 30), (30, 41)], [(0, 13)], [(0, 1), (1, 2), (2, 3)]]
HIDDEN = 128


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu-spans")
    # head_dim 64: FlashInfer's fa2 tiling.
    bert = build_tiny_bert(root / "bert", hidden=HIDDEN, heads=2)
    return build_st_model(bert, root / "st", pooling="mean", normalize=False)


@pytest.fixture(scope="module")
def eager(model_dir: Path) -> Engine:
    return Engine.load(model_dir, device="cuda", graphs=False)


def _pack(
    seqs: list[list[int]], chunks: list[list[tuple[int, int]]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed ids, offsets and absolute spans; a sequence with no chunks is a batch-mate."""
    ids = np.array([t for s in seqs for t in s], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int32)
    spans = np.array([c for doc in chunks for c in doc], dtype=np.int32).reshape(-1, 2)
    span_offsets = np.concatenate([[0], np.cumsum([len(d) for d in chunks])]).astype(np.int32)
    return ids, offsets, absolute_spans(spans, span_offsets, offsets)


def _reference(
    model_dir: Path, seqs: list[list[int]], chunks: list[list[tuple[int, int]]]
) -> torch.Tensor:
    import transformers

    hf = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).to("cuda").eval()
    rows = []
    for seq, doc in zip(seqs, chunks, strict=True):
        if not doc:
            continue
        with torch.no_grad():
            hidden = hf(input_ids=torch.tensor([seq], device="cuda")).last_hidden_state[0]
        rows += [hidden[a:b].mean(0) for a, b in doc]
    return torch.stack(rows).float()


def _min_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1).min().item()


def _per_token(length: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(length)]


def test_span_rows_in_bf16_equal_transformers_fp32_and_pooled_rows_equal_the_graphs(
    model_dir: Path,
) -> None:
    engine = Engine.load(model_dir, device="cuda")
    ids, offsets, spans = _pack(SEQS, CHUNKS)
    engine.warmup([len(ids)])
    replayed = engine.embed(ids, offsets)  # through the bucket's plain graph
    assert engine.runner is not None and engine.runner.graph_batches == 1
    pooled, rows = engine.embed_with_spans(ids, offsets, spans)
    assert engine.runner.eager_batches == 1  # the span graph is not captured yet
    assert rows.dtype == torch.float32 and rows.shape == (len(spans), HIDDEN)
    assert _min_cos(rows, _reference(model_dir, SEQS, CHUNKS)) >= 0.999
    torch.testing.assert_close(pooled, replayed, atol=2e-2, rtol=2e-2)


def test_span_batches_replay_the_buckets_span_graph_and_equal_eager_and_transformers(
    model_dir: Path, eager: Engine
) -> None:
    engine = Engine.load(model_dir, device="cuda")
    runner = engine.runner
    assert runner is not None
    ids, offsets, spans = _pack(SEQS, CHUNKS)
    bucket = runner.bucket_for(len(ids), len(SEQS))
    engine.embed_with_spans(ids, offsets, spans)  # eager; captures the span graph after
    assert (runner.eager_batches, runner.graph_batches) == (1, 0)
    assert bucket in runner.span_graphs, f"capture failed: {runner.span_failed}"
    pooled, rows = engine.embed_with_spans(ids, offsets, spans)
    assert (runner.eager_batches, runner.graph_batches) == (1, 1)  # replayed
    want_pooled, want_rows = eager.embed_with_spans(ids, offsets, spans)
    assert rows.dtype == torch.float32 and rows.shape == want_rows.shape == (len(spans), HIDDEN)
    assert _min_cos(rows, want_rows) >= 0.999
    assert _min_cos(rows, _reference(model_dir, SEQS, CHUNKS)) >= 0.999
    assert _min_cos(pooled, want_pooled) >= 0.999
    torch.testing.assert_close(rows, want_rows, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("warm", [True, False])
def test_one_span_graph_replays_every_layout_of_its_bucket(
    model_dir: Path, eager: Engine, warm: bool
) -> None:
    engine = Engine.load(model_dir, device="cuda")
    runner = engine.runner
    assert runner is not None
    layouts = [
        CHUNKS,
        # Per-token vectors of one document (/embed_all), its batch-mates pooled: more rows.
        [_per_token(len(SEQS[0])), [], []],
        # One chunk after many: the slots past it must not keep the last batch's rows.
        [[], [(1, 12)], []],
        [[(0, 42)], [(0, 13)], [(0, 3)]],
    ]
    if warm:
        engine.warmup([64], spans=True)
        assert 64 in runner.span_graphs, f"capture failed: {runner.span_failed}"
    else:
        engine.embed_with_spans(*_pack(SEQS, CHUNKS))  # eager, then the lazy capture
    eager_before = runner.eager_batches
    for chunks in layouts:
        ids, offsets, spans = _pack(SEQS, chunks)
        pooled, rows = engine.embed_with_spans(ids, offsets, spans)
        want_pooled, want_rows = eager.embed_with_spans(ids, offsets, spans)
        assert rows.shape == want_rows.shape == (len(spans), HIDDEN)
        assert _min_cos(rows, want_rows) >= 0.999, chunks
        assert _min_cos(rows, _reference(model_dir, SEQS, chunks)) >= 0.999, chunks
        assert _min_cos(pooled, want_pooled) >= 0.999, chunks
    assert runner.eager_batches == eager_before  # every layout replayed the 64-token graph
    assert runner.graph_batches == len(layouts)


def test_long_documents_replay_a_large_buckets_span_graph(model_dir: Path, eager: Engine) -> None:
    engine = Engine.load(model_dir, device="cuda")
    runner = engine.runner
    assert runner is not None
    rng = np.random.default_rng(7)
    seqs = [[101, *rng.integers(1000, 30000, size=118).tolist(), 102] for _ in range(8)]
    chunks = [[(1, 1 + k), (1 + k, 60), (60, 119)] for k in range(1, 9)]
    ids, offsets, spans = _pack(seqs, chunks)
    engine.warmup([len(ids)], spans=True)
    bucket = runner.bucket_for(len(ids), len(seqs))
    assert bucket == 1024 and bucket in runner.span_graphs, runner.span_failed
    _, rows = engine.embed_with_spans(ids, offsets, spans)
    assert (runner.graph_batches, runner.eager_batches) == (1, 0)
    _, want = eager.embed_with_spans(ids, offsets, spans)
    assert _min_cos(rows, want) >= 0.999
    assert _min_cos(rows, _reference(model_dir, seqs, chunks)) >= 0.999


def test_overlapping_spans_run_eagerly_beside_a_captured_span_graph(
    model_dir: Path, eager: Engine
) -> None:
    engine = Engine.load(model_dir, device="cuda")
    runner = engine.runner
    assert runner is not None
    engine.warmup([64], spans=True)
    # Not what the wire sends (its spans are disjoint), but the engine's contract allows it.
    chunks = [[(1, 30), (10, 41)], [(0, 13)], []]
    ids, offsets, spans = _pack(SEQS, chunks)
    _, rows = engine.embed_with_spans(ids, offsets, spans)
    assert (runner.graph_batches, runner.eager_batches) == (0, 1)
    _, want = eager.embed_with_spans(ids, offsets, spans)
    assert _min_cos(rows, want) >= 0.999
    assert _min_cos(rows, _reference(model_dir, SEQS, chunks)) >= 0.999

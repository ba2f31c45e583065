"""Span rows (contextualized chunks, per-token vectors) against transformers in fp32 on CPU:
each row is the mean of the whole sequence's last hidden states over its token range."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.client.spans import check_mean_pooled
from mesh.errors import InvalidInput
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads.spans import absolute_spans, span_means
from mesh.worker.pipeline import ResultPipeline
from proto_msgs import BatchAssign, ModelInfo, OutputOptions
from tests.st_models import build_st_model, build_tiny_bert
from tests.unit.engine.engine_helpers import pack, random_seqs


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("span_bert")
    bert = build_tiny_bert(root / "bert")
    return build_st_model(bert, root / "st", pooling="mean", normalize=False)


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Engine:
    return Engine.load(tiny_dir, device="cpu", dtype=torch.float32, threads=1)


def _reference(model_dir: Path, seq: list[int]) -> torch.Tensor:
    import transformers

    hf = transformers.AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=torch.tensor([seq])).last_hidden_state[0]


def test_span_rows_are_means_of_the_whole_documents_hidden_states(
    tiny_dir: Path, engine: Engine
) -> None:
    seqs = random_seqs(engine.vocab_size, [40, 17, 64], seed=4)
    ids, offsets = pack(seqs)
    # Chunks of documents 0 and 2 (sequence 1 is pooled as usual); relative to each sequence.
    chunks = {0: [(1, 9), (9, 30), (30, 39)], 2: [(0, 1), (5, 64)]}
    spans = np.array([s for i in (0, 2) for s in chunks[i]], dtype=np.int32)
    span_offsets = np.array([0, 3, 3, 5], dtype=np.int32)
    pooled, rows = engine.embed_with_spans(
        ids, offsets, absolute_spans(spans, span_offsets, offsets)
    )
    assert rows.dtype == torch.float32 and rows.shape == (5, engine.hidden_size)
    expected = []
    for i in (0, 2):
        hidden = _reference(tiny_dir, seqs[i])
        expected += [hidden[a:b].mean(dim=0) for a, b in chunks[i]]
    torch.testing.assert_close(rows, torch.stack(expected), atol=2e-5, rtol=1e-5)
    # The same forward's pooled rows are embed's.
    torch.testing.assert_close(pooled, engine.embed(ids, offsets), atol=1e-6, rtol=1e-6)


def test_one_token_spans_are_the_raw_hidden_states(tiny_dir: Path, engine: Engine) -> None:
    seq = random_seqs(engine.vocab_size, [23], seed=9)[0]
    ids, offsets = pack([seq])
    spans = np.stack([np.arange(23), np.arange(1, 24)], axis=1)
    _, rows = engine.embed_with_spans(ids, offsets, spans)
    torch.testing.assert_close(rows, _reference(tiny_dir, seq), atol=2e-5, rtol=1e-5)


def test_a_span_across_two_sequences_is_refused(engine: Engine) -> None:
    ids, offsets = pack(random_seqs(engine.vocab_size, [5, 5], seed=1))
    with pytest.raises(ValueError, match="inside one sequence"):
        engine.embed_with_spans(ids, offsets, np.array([[3, 7]]))


def test_span_means_accumulate_in_fp32_from_bf16() -> None:
    hidden = torch.full((600, 4), 1.0 + 2**-7, dtype=torch.bfloat16)
    rows = span_means(hidden, np.array([[0, 600]]))
    assert rows.dtype == torch.float32
    torch.testing.assert_close(rows, torch.full((1, 4), 1.0 + 2**-7))


def test_a_batch_mixing_span_and_plain_requests_answers_each_group_its_rows(
    engine: Engine,
) -> None:
    seqs = random_seqs(engine.vocab_size, [9, 12, 6], seed=2)
    ids, offsets = pack(seqs)
    outputs = [OutputOptions(dims=16), OutputOptions(rows="spans", normalize=False)]
    batch = BatchAssign(
        batch_id=1,
        model="m",
        timeout_ms=1000,
        outputs=outputs,
        output_index=np.array([1, 0, 1], np.int32),
        token_ids=ids,
        offsets=offsets,
        spans=np.array([[0, 4], [4, 9], [1, 5]], np.int32),
        span_offsets=np.array([0, 2, 2, 3], np.int32),
    )
    pipe = ResultPipeline(engine, engine.device)
    results, _ = pipe.collect(pipe.launch(batch))
    plain = engine.embed_final(ids[9:21], np.array([0, 12], np.int32), dims=16, normalize=True)
    np.testing.assert_allclose(results[0], plain, atol=1e-6)
    spans = absolute_spans(batch.spans, batch.span_offsets, offsets)
    _, rows = engine.embed_with_spans(ids, offsets, spans)
    np.testing.assert_allclose(results[1], rows.numpy(), atol=1e-6)
    assert results[1].shape == (3, engine.hidden_size)


def test_only_mean_pooled_models_without_dense_serve_contextualized_chunks() -> None:
    base = ModelInfo("m", [], 32, 128, 100, "mean", True, "d", hidden_size=32)
    check_mean_pooled(base)
    for bad, words in [
        (dataclasses.replace(base, pooling="cls"), "pooling 'cls'"),
        (dataclasses.replace(base, has_dense=True), "Dense layers"),
        (dataclasses.replace(base, hidden_size=0), "upgrade them"),
        (dataclasses.replace(base, task="score"), "cross-encoder"),
    ]:
        with pytest.raises(InvalidInput, match=words):
            check_mean_pooled(bad)

"""Sparse (SPLADE) models on CPU in fp32: the card reads the sentence-transformers sparse layout,
the engine's weights equal ``SparseEncoder.encode`` (and the formula over transformers'
``BertForMaskedLM`` logits), chunked pooling equals one pass, ``sparse_rows`` keeps the top_k
over the threshold sorted by id, and what is not served is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads import sparse as sparse_module
from mesh.worker.engine.heads.sparse import sparse_rows
from tests.st_models import build_splade
from tests.unit.engine.engine_helpers import tokenized

TEXTS = [
    "what is a sparse lexical representation?",
    "SPLADE expands queries and documents over the vocabulary",
    "a",
    "Grüße aus München — naïve café",
    " ".join(["long passage about retrieval and inverted indexes"] * 12),
]


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_splade(tmp_path_factory.mktemp("splade") / "tiny-splade")


@pytest.fixture(scope="module")
def engine(splade_dir: Path) -> Engine:
    return Engine.load(splade_dir, threads=2)


@pytest.fixture(scope="module")
def reference(splade_dir: Path) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(splade_dir), device="cpu")
    return model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()


def _packed(engine: Engine, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return tokenized(engine.card.tokenizer_json, texts, engine.card.max_input_tokens)


def test_the_card_of_a_splade_model_says_sparse_and_weighs_the_vocabulary(splade_dir: Path) -> None:
    card = read_card(splade_dir)
    assert (card.task, card.pooling, card.dims, card.normalize) == (
        "sparse",
        "splade",
        30522,
        False,
    )
    assert card.splade is not None and (card.splade.strategy, card.splade.activation) == (
        "max",
        "relu",
    )


def test_engine_weights_equal_sparse_encoder_encode(engine: Engine, reference: np.ndarray) -> None:
    ids, offsets = _packed(engine, TEXTS)
    ours = engine.embed(ids, offsets).numpy()
    assert ours.shape == reference.shape
    assert (reference > 0).sum(axis=1).min() > 20  # the tiny model is not trivially sparse
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    assert ((ours > 0) == (reference > 0)).mean() > 0.9999


def test_engine_weights_equal_the_formula_over_bert_for_masked_lm_logits(
    engine: Engine, splade_dir: Path
) -> None:
    import transformers

    mlm = transformers.BertForMaskedLM.from_pretrained(splade_dir).eval()
    ids, offsets = _packed(engine, TEXTS[:2])
    ours = engine.embed(ids, offsets).numpy()
    for i in range(2):
        seq = torch.from_numpy(ids[offsets[i] : offsets[i + 1]].astype(np.int64))[None]
        with torch.no_grad():
            logits = mlm(input_ids=seq).logits[0]
        expected = torch.log1p(torch.relu(logits)).amax(dim=0).numpy()
        np.testing.assert_allclose(ours[i], expected, rtol=1e-4, atol=1e-5)


def test_chunked_pooling_equals_one_pass(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    ids, offsets = _packed(engine, TEXTS)
    whole = engine.embed(ids, offsets)
    # 3 tokens a chunk: chunks cut through sequences, the max still sees each token once.
    monkeypatch.setattr(sparse_module, "CHUNK_ELEMENTS", 3 * 30522)
    # Not bit for bit: the CPU BLAS picks its kernel by the GEMM's row count, so a 3-row chunk's
    # logits can round differently from the whole batch's (7e-7 seen on CI). A token missed or
    # pooled into the wrong row moves weights by orders more than this tolerance.
    torch.testing.assert_close(engine.embed(ids, offsets), whole, rtol=1e-5, atol=1e-5)


def test_sparse_rows_keep_the_top_k_over_the_threshold_sorted_by_id() -> None:
    weights = torch.tensor([[0.0, 0.5, 0.0, 2.0, 0.125, 1.0], [0.0, 0.0, 0.0, 0.375, 0.0, 0.0]])
    rows = sparse_rows(weights, top_k=3, threshold=0.2).numpy()
    assert rows.shape == (2, 6)
    np.testing.assert_array_equal(rows[0], [1, 3, 5, 0.5, 2.0, 1.0])
    np.testing.assert_array_equal(rows[1], [3, 0, 0, 0.375, 0, 0])  # zero-padded
    # top_k over the vocabulary: every weight over 0, in rows as wide as the most a row kept
    # (4: the first row's), not as the vocabulary.
    rows = sparse_rows(weights, top_k=100).numpy()
    assert rows.shape == (2, 8)
    np.testing.assert_array_equal(rows[0], [1, 3, 4, 5, 0.5, 2.0, 0.125, 1.0])
    np.testing.assert_array_equal(rows[1], [3, 0, 0, 0, 0.375, 0, 0, 0])
    # Rows of nothing kept are one pad wide.
    assert sparse_rows(weights, top_k=100, threshold=5.0).numpy().tolist() == [[0, 0], [0, 0]]


def test_engine_top_k_rows_are_the_reference_largest_weights(
    engine: Engine, reference: np.ndarray
) -> None:
    ids, offsets = _packed(engine, TEXTS)
    rows = engine.embed_final(ids, offsets, kind="sparse", top_k=16, threshold=0.05)
    k = rows.shape[1] // 2  # the most pairs a row kept, at most top_k
    assert 1 <= k <= 16 and rows.shape[1] == 2 * k
    for row, ref in zip(rows, reference, strict=True):
        kept = row[k:] > 0
        got_ids = row[:k][kept].astype(np.int64)
        assert np.all(np.diff(got_ids) > 0)  # sorted by id, no repeat
        top = np.sort(ref[ref > 0.05])[::-1][:16]
        np.testing.assert_allclose(np.sort(row[k:][kept])[::-1], top, rtol=1e-4)
        np.testing.assert_allclose(row[k:][kept], ref[got_ids], rtol=1e-4)


def test_a_sparse_layout_with_other_modules_is_refused_by_name(
    splade_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(splade_dir, bad)
    modules = json.loads((bad / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "Normalize"})
    (bad / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="MLMTransformer then SpladePooling"):
        read_card(bad)
    cfg = bad / "1_SpladePooling" / "config.json"
    (bad / "modules.json").write_text(json.dumps(modules[:2]))
    cfg.write_text(json.dumps({"pooling_strategy": "mean", "activation_function": "relu"}))
    with pytest.raises(ValueError, match="pooling_strategy"):
        read_card(bad)


def test_sum_pooling_and_log1p_relu_equal_sparse_encoder(splade_dir: Path, tmp_path: Path) -> None:
    from sentence_transformers import SparseEncoder

    other = tmp_path / "sum-log1p"
    shutil.copytree(splade_dir, other)
    cfg = {"pooling_strategy": "sum", "activation_function": "log1p_relu"}
    (other / "1_SpladePooling" / "config.json").write_text(json.dumps(cfg))
    engine = Engine.load(other, threads=2)
    assert engine.card.splade is not None and engine.card.splade.strategy == "sum"
    ids, offsets = _packed(engine, TEXTS)
    ours = engine.embed(ids, offsets).numpy()
    ref = SparseEncoder(str(other), device="cpu").encode(TEXTS, convert_to_tensor=True)
    np.testing.assert_allclose(ours, ref.to_dense().numpy(), rtol=1e-4, atol=1e-5)

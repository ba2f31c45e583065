"""bge-m3's lexical weights on CPU in fp32: the card finds the sparse head, the engine's weights
equal FlagEmbedding's formula over transformers' last hidden states (relu of the head, max per
token id, special tokens left out), its dense vectors stay those of a CLS-pooled embedder, a
pipeline batch mixing both gets each, and the pickled head is refused until converted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine import convert_m3
from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads.lexical import HEAD_FILE, PICKLED_HEAD_FILE, special_ids
from mesh.worker.engine.heads.sparse import sparse_rows
from mesh.worker.pipeline import ResultPipeline
from proto_msgs import BatchAssign, OutputOptions
from tests.st_models import build_m3_lexical
from tests.unit.engine.engine_helpers import tokenized

TEXTS = [
    "what is a lexical weight?",
    "bge-m3 gives dense, sparse and multi-vector retrieval from one forward",
    "a",
    "the the the repeated tokens keep their largest weight",
    "Grüße aus München — naïve café [UNK]",
]


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_m3_lexical(tmp_path_factory.mktemp("m3") / "tiny-m3")


@pytest.fixture(scope="module")
def engine(m3_dir: Path) -> Engine:
    return Engine.load(m3_dir, threads=2)


def _packed(engine: Engine, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return tokenized(engine.card.tokenizer_json, texts)


def _flag_embedding(m3_dir: Path, ids: np.ndarray, offsets: np.ndarray) -> list[dict[int, float]]:
    """FlagEmbedding's lexical weights, one text at a time: relu(sparse_linear(last hidden
    state)) per token, the max per id, CLS/EOS(SEP)/PAD/UNK and zero weights left out."""
    import transformers
    from safetensors.torch import load_file

    model = transformers.XLMRobertaModel.from_pretrained(m3_dir).eval()
    head = load_file(str(m3_dir / HEAD_FILE))
    tok = transformers.AutoTokenizer.from_pretrained(m3_dir)
    unused = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id}
    out = []
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        seq = torch.from_numpy(ids[start:end].astype(np.int64))[None]
        with torch.no_grad():
            hidden = model(input_ids=seq).last_hidden_state[0]
            weights = torch.relu(hidden @ head["weight"].T + head["bias"])[:, 0]
        best: dict[int, float] = {}
        for token, w in zip(seq[0].tolist(), weights.tolist(), strict=True):
            if token not in unused and w > 0:
                best[token] = max(best.get(token, 0.0), w)
        out.append(best)
    return out


def test_the_card_of_a_bge_m3_directory_embeds_and_has_lexical_weights(m3_dir: Path) -> None:
    card = read_card(m3_dir)
    assert card.task == "embed" and card.lexical
    assert card.pooling == "cls" and card.normalize and card.dims == 32
    assert not read_card(m3_dir.with_name(m3_dir.name + "-raw")).lexical


def test_special_ids_are_the_tokenizers_cls_sep_pad_and_unk(m3_dir: Path) -> None:
    assert special_ids(m3_dir) == [0, 100, 101, 102]  # MiniLM's [PAD], [UNK], [CLS], [SEP]


def test_lexical_weights_equal_flag_embeddings_formula(engine: Engine, m3_dir: Path) -> None:
    ids, offsets = _packed(engine, TEXTS)
    _, weights = engine.embed_lexical(ids, offsets)
    assert weights.shape == (len(TEXTS), 30522)
    reference = _flag_embedding(m3_dir, ids, offsets)
    for row, ref in zip(weights.numpy(), reference, strict=True):
        kept = np.flatnonzero(row)
        assert sorted(ref) == kept.tolist()
        assert ref, "the head must keep some tokens for the test to mean anything"
        np.testing.assert_allclose(row[kept], [ref[i] for i in kept], rtol=1e-5, atol=1e-6)
    # A repeated token keeps its largest weight: "the" appears three times in text 3.
    assert len(reference[3]) < int(np.diff(offsets)[3]) - 2


def test_sparse_rows_of_lexical_weights_keep_the_top_k_sorted_by_id(engine: Engine) -> None:
    ids, offsets = _packed(engine, TEXTS)
    _, weights = engine.embed_lexical(ids, offsets)
    rows = sparse_rows(weights, top_k=3).numpy()
    for row, full in zip(rows, weights.numpy(), strict=True):
        kept = row[3:] > 0
        top = np.sort(np.argsort(-full)[: min(3, np.count_nonzero(full))])
        assert row[:3][kept].astype(int).tolist() == top.tolist()


def test_dense_vectors_are_the_cls_pooled_embedding_unchanged(engine: Engine, m3_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    ids, offsets = _packed(engine, TEXTS)
    ours = engine.embed_final(ids, offsets)
    pooled, _ = engine.embed_lexical(ids, offsets)
    np.testing.assert_array_equal(engine.embed(ids, offsets).numpy(), pooled.numpy())
    reference = SentenceTransformer(str(m3_dir), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, reference, atol=2e-5)


def test_a_batch_mixing_dense_and_sparse_groups_gets_each(engine: Engine) -> None:
    ids, offsets = _packed(engine, TEXTS)
    dense = OutputOptions()
    sparse = OutputOptions(normalize=False, kind="sparse", top_k=8)
    owner = np.array([0, 1, 0, 1, 1], dtype=np.int32)
    batch = BatchAssign(
        batch_id=1, model=engine.card.name, timeout_ms=60_000, token_ids=ids, offsets=offsets,
        outputs=[dense, sparse], output_index=owner,
    )  # fmt: skip
    pipeline = ResultPipeline(engine, torch.device("cpu"))
    (vectors, rows), _ = pipeline.collect(pipeline.launch(batch))
    np.testing.assert_allclose(vectors, engine.embed_final(ids, offsets)[owner == 0], atol=1e-6)
    _, weights = engine.embed_lexical(ids, offsets)
    np.testing.assert_array_equal(rows, sparse_rows(weights[owner == 1], 8).numpy())


def test_a_pickled_head_is_refused_until_converted(m3_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    pickled = build_m3_lexical(tmp_path / "pickled-m3", pickled=True)
    assert not (pickled / HEAD_FILE).exists()
    with pytest.raises(ValueError, match=r"sparse_linear\.pt.*convert_m3"):
        read_card(pickled)
    assert convert_m3.main([str(pickled)]) == 0
    assert read_card(pickled).lexical
    head = load_file(str(pickled / HEAD_FILE))
    assert torch.equal(head["weight"], torch.load(pickled / PICKLED_HEAD_FILE)["weight"])


def test_the_converter_refuses_a_pickle_that_is_not_the_head_or_none_at_all(tmp_path: Path) -> None:
    torch.save({"weight": torch.zeros(1, 4)}, tmp_path / PICKLED_HEAD_FILE)
    assert convert_m3.main([str(tmp_path)]) == 1
    assert not (tmp_path / HEAD_FILE).exists()
    (tmp_path / PICKLED_HEAD_FILE).unlink()
    with pytest.raises(ValueError, match="no sparse_linear.pt nor colbert_linear.pt"):
        convert_m3.convert(tmp_path)
    assert convert_m3.main([]) == 2


def test_a_batch_with_spans_and_lexical_weights_gets_both(engine: Engine) -> None:
    ids, offsets = _packed(engine, TEXTS)
    lengths = np.diff(offsets)
    spans_out = OutputOptions(normalize=False, rows="spans")
    sparse = OutputOptions(normalize=False, kind="sparse", top_k=4)
    owner = np.array([0, 1, 1, 0, 1], dtype=np.int32)
    # One span per sequence of the span group: its tokens after the first.
    spans = np.array([[1, lengths[0]], [1, lengths[3]]], dtype=np.int32)
    span_offsets = np.array([0, 1, 1, 1, 2, 2], dtype=np.int32)
    batch = BatchAssign(
        batch_id=2, model=engine.card.name, timeout_ms=60_000, token_ids=ids, offsets=offsets,
        outputs=[spans_out, sparse], output_index=owner, spans=spans, span_offsets=span_offsets,
    )  # fmt: skip
    batch.validate()
    pipeline = ResultPipeline(engine, torch.device("cpu"))
    (span_rows, rows), _ = pipeline.collect(pipeline.launch(batch))
    _, weights = engine.embed_lexical(ids, offsets)
    np.testing.assert_array_equal(rows, sparse_rows(weights[owner == 1], 4).numpy())
    assert span_rows.shape == (2, engine.hidden_size)


def test_the_converter_converts_both_of_bge_m3s_pickled_heads(tmp_path: Path) -> None:
    torch.save({"weight": torch.ones(1, 4), "bias": torch.zeros(1)}, tmp_path / PICKLED_HEAD_FILE)
    torch.save({"weight": torch.eye(4), "bias": torch.zeros(4)}, tmp_path / "colbert_linear.pt")
    written = convert_m3.convert(tmp_path)
    assert [p.name for p in written] == [HEAD_FILE, "colbert_linear.safetensors"]


def test_a_directory_with_both_bge_m3_heads_loads_with_both(m3_dir: Path, tmp_path: Path) -> None:
    """Real bge-m3 ships both heads beside the backbone (each ``weight`` and ``bias``): they
    are its heads, not backbone weights read twice."""
    import json
    import shutil

    from safetensors.torch import save_file

    from mesh.worker.engine.heads.colbert import M3_HEAD
    from mesh.worker.engine.weights import SIDE_HEAD_FILES

    assert set(SIDE_HEAD_FILES) == {HEAD_FILE, f"{M3_HEAD}.safetensors"}
    both = tmp_path / "m3-both"
    shutil.copytree(m3_dir, both)
    hidden = json.loads((m3_dir / "config.json").read_text())["hidden_size"]
    head = {"weight": torch.eye(hidden), "bias": torch.zeros(hidden)}
    save_file(head, str(both / f"{M3_HEAD}.safetensors"))
    engine = Engine.load(both, threads=2)
    assert engine.lexical is not None and engine.card.multivector is not None
    assert engine.card.multivector.out_features == hidden
    ids, offsets = _packed(engine, TEXTS[:2])
    _, weights = engine.embed_lexical(ids, offsets)
    assert weights.shape[0] == 2 and float(weights.max()) > 0

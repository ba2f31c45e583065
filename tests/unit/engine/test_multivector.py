"""bge-m3's colbert vectors: ours equal FlagEmbedding's formula on transformers' last hidden
state in fp32 (``normalize(colbert_linear(h[1:]))``), and a head we cannot load exactly is
refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mesh.client.spans import token_spans
from mesh.worker.engine import convert_m3
from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads.colbert import convert_pickled_head
from mesh.worker.engine.heads.spans import absolute_spans
from mesh.worker.pipeline import ResultPipeline
from proto_msgs import BatchAssign, ModelInfo, OutputOptions, ProtocolError
from tests.st_models import build_m3_colbert
from tests.unit.engine.engine_helpers import pack, random_seqs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_m3_colbert(tmp_path_factory.mktemp("m3") / "tiny-m3")


@pytest.fixture(scope="module")
def engine(m3_dir: Path) -> Engine:
    return Engine.load(m3_dir)


def _reference(model_dir: Path, seq: list[int]) -> torch.Tensor:
    """FlagEmbedding's ``_colbert_embedding`` of one unpadded text, then its normalization."""
    model = transformers.XLMRobertaModel.from_pretrained(model_dir).eval()
    head = load_file(str(model_dir / "colbert_linear.safetensors"))
    with torch.no_grad():
        hidden = model(torch.tensor([seq])).last_hidden_state[0]
    vecs = hidden[1:] @ head["weight"].T + head["bias"]
    return torch.nn.functional.normalize(vecs, dim=-1)


def _batch(seqs: list[list[int]], outputs: list[OutputOptions], index: list[int]) -> BatchAssign:
    ids, offsets = pack(seqs)
    spanned = [outputs[g].rows != "sequence" for g in index]
    lengths = np.diff(offsets)
    spans, span_offsets = token_spans(lengths, first=1)
    # Only the span groups' sequences keep spans.
    keep = np.repeat(np.array(spanned), lengths - 1)
    counts = np.where(spanned, lengths - 1, 0)
    offsets_s = np.zeros(len(seqs) + 1, np.int32)
    np.cumsum(counts, out=offsets_s[1:])
    return BatchAssign(
        batch_id=1, model="m", timeout_ms=1000, outputs=outputs,
        output_index=np.array(index, np.int32), token_ids=ids, offsets=offsets,
        spans=spans[keep], span_offsets=offsets_s,
    )  # fmt: skip


def test_the_card_states_the_head_and_its_width(m3_dir: Path) -> None:
    card = read_card(m3_dir)
    assert card.family == "xlm-roberta"
    assert card.multivector is not None and card.multivector.out_features == 32


def test_colbert_vectors_equal_flagembeddings_formula_in_fp32(m3_dir: Path, engine: Engine) -> None:
    seqs = random_seqs(engine.vocab_size, [2, 9, 40, 5], seed=4)
    mv = OutputOptions(dims=None, normalize=True, rows="multivector")
    pipe = ResultPipeline(engine, engine.device)
    results, _ = pipe.collect(pipe.launch(_batch(seqs, [mv], [0, 0, 0, 0])))
    ref = torch.cat([_reference(m3_dir, s) for s in seqs])
    assert results[0].shape == (sum(len(s) - 1 for s in seqs), 32)
    np.testing.assert_allclose(results[0], ref.numpy(), atol=2e-6)


def test_a_batch_mixing_raw_token_states_and_colbert_vectors_answers_each_its_own(
    m3_dir: Path, engine: Engine
) -> None:
    seqs = random_seqs(engine.vocab_size, [7, 12, 6], seed=5)
    outputs = [
        OutputOptions(rows="multivector"),
        OutputOptions(dims=8),
        OutputOptions(rows="spans", normalize=False),
    ]
    results, _ = (pipe := ResultPipeline(engine, engine.device)).collect(
        pipe.launch(_batch(seqs, outputs, [0, 1, 2]))
    )
    np.testing.assert_allclose(results[0], _reference(m3_dir, seqs[0]).numpy(), atol=2e-6)
    assert results[1].shape == (1, 8)
    ids, offsets = pack(seqs[2:])
    _, rows = engine.embed_with_spans(
        ids, offsets, absolute_spans(*token_spans(np.diff(offsets), 1), offsets)
    )
    np.testing.assert_allclose(results[2], rows.numpy(), atol=1e-6)


def test_a_pickle_only_head_is_refused_naming_the_conversion(m3_dir: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(m3_dir, tmp_path / "m3-pt")
    (copy / "colbert_linear.safetensors").rename(copy / "colbert_linear.pt")
    with pytest.raises(ValueError, match=r"colbert_linear\.pt is a pickle.*convert_m3"):
        read_card(copy)


def test_the_converted_pickle_loads_as_the_safetensors_head(m3_dir: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(m3_dir, tmp_path / "m3-convert")
    head = load_file(str(copy / "colbert_linear.safetensors"))
    (copy / "colbert_linear.safetensors").unlink()
    torch.save(head, copy / "colbert_linear.pt")
    assert convert_pickled_head(copy) == copy / "colbert_linear.safetensors"
    converted = load_file(str(copy / "colbert_linear.safetensors"))
    assert all(torch.equal(converted[k], head[k]) for k in ("weight", "bias"))
    assert read_card(copy).multivector == read_card(m3_dir).multivector
    assert convert_pickled_head(m3_dir) is None


def test_the_command_the_refusal_names_converts_a_colbert_only_pickle(
    m3_dir: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(m3_dir, tmp_path / "m3-cli")
    torch.save(load_file(str(copy / "colbert_linear.safetensors")), copy / "colbert_linear.pt")
    (copy / "colbert_linear.safetensors").unlink()
    assert convert_m3.main([str(copy)]) == 0
    assert read_card(copy).multivector == read_card(m3_dir).multivector


def test_a_colbert_checkpoint_without_its_projection_is_refused_naming_it(
    m3_dir: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(m3_dir, tmp_path / "colbert")
    (copy / "artifact.metadata").write_text("{}")  # colbert-ai's, served: test_late_interaction
    with pytest.raises(ValueError, match=r"ColBERT model \(colbert-ai\).*linear\.weight"):
        read_card(copy)


def test_a_misshapen_head_is_refused(m3_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    copy = shutil.copytree(m3_dir, tmp_path / "bad")
    save_file({"weight": torch.zeros(8, 5)}, str(copy / "colbert_linear.safetensors"))
    with pytest.raises(ValueError, match=r"needs 'weight' \[out, 32\]"):
        read_card(copy)


def test_model_info_checks_the_multivector_width() -> None:
    info = ModelInfo("m", [], 32, 128, 100, "cls", True, "d", multivector_dims=-1)
    with pytest.raises(ProtocolError, match="multivector_dims"):
        info.check("READY")

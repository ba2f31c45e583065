"""Our XLM-RoBERTa / RoBERTa encoder beyond the family table's comparison
(``test_families.py``, positions after the pad id included): a full-length input, RoBERTa and
masked-LM checkpoints; refusals by name."""

from __future__ import annotations

from pathlib import Path

import family_table
import pytest
import torch
from engine_helpers import (
    assert_matches_reference,
    pack,
    random_seqs,
    randomize,
    reference_pooled,
    save_model_dir,
)

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 400
PAD = 1
LENGTHS = [1, 5, 2, 77, 16, 120, 9]


def _config(cls=None, **kw):  # noqa: ANN001, ANN202
    cls = cls or transformers.XLMRobertaConfig
    return cls(**(family_table.XLM_ROBERTA.config | kw))


def _model(cls, config, seed: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = cls(config).eval()
    randomize(model, seed=seed)
    return model


@pytest.fixture(scope="module")
def hf_model() -> torch.nn.Module:
    return family_table.hf_model(family_table.XLM_ROBERTA)


def _seqs(seed: int) -> list[list[int]]:
    seqs = random_seqs(VOCAB, LENGTHS, seed=seed)
    # Pad ids inside a sequence take the pad row and shift the positions after them.
    seqs[3][10:13] = [PAD, PAD, PAD]
    seqs[5][0] = PAD
    return seqs


def test_a_full_length_input_uses_the_last_position_row(hf_model, tmp_path: Path) -> None:
    engine = Engine.load(save_model_dir(hf_model, tmp_path / "m", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, [128, 3], seed=33)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf_model, seqs, "mean"))


def test_roberta_and_a_masked_lm_checkpoint_load_the_same_way(tmp_path: Path) -> None:
    lm = _model(transformers.RobertaForMaskedLM, _config(transformers.RobertaConfig), seed=34)
    path = save_model_dir(lm, tmp_path / "roberta-mlm", VOCAB, "mean")
    card = read_card(path)
    assert (card.family, card.causal, card.pooling) == ("xlm-roberta", False, "mean")
    seqs = _seqs(seed=35)
    ref = reference_pooled(lm.roberta, seqs, "mean")
    assert_matches_reference(Engine.load(path).embed(*pack(seqs)), ref)


def test_a_relative_position_variant_is_refused_by_name(hf_model, tmp_path: Path) -> None:
    changes = {"position_embedding_type": "relative_key"}
    path = save_model_dir(hf_model, tmp_path / "rel", VOCAB, "mean", changes)
    with pytest.raises(NotImplementedError, match="position_embedding_type 'relative_key'"):
        Engine.load(path)


def test_another_activation_is_refused_by_name(hf_model, tmp_path: Path) -> None:
    path = save_model_dir(hf_model, tmp_path / "act", VOCAB, "mean", {"hidden_act": "relu"})
    with pytest.raises(NotImplementedError, match="hidden_act 'relu'"):
        Engine.load(path)

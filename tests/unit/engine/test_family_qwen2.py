"""Our Qwen2 embedder (q/k/v biases, no q/k norm) beyond the family table's comparison
(``test_families.py``: causal last-token and bidirectional mean pooling): the table's model
has the biases, a causal-LM checkpoint loads without a pooling config; refusals by name."""

from __future__ import annotations

from pathlib import Path

import family_table
import pytest
from engine_helpers import (
    assert_matches_reference,
    pack,
    random_seqs,
    reference_pooled,
    save_model_dir,
)

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 500
LENGTHS = [1, 2, 7, 19, 64, 3, 130, 33]


def _config() -> transformers.Qwen2Config:
    return family_table.config(family_table.QWEN2)


@pytest.fixture(scope="module")
def hf_model() -> transformers.Qwen2Model:
    return family_table.hf_model(family_table.QWEN2)


def test_the_family_tables_qwen2_exercises_the_qkv_biases(hf_model) -> None:
    # The table's comparison (test_families.py) checks them only if the model has them.
    assert hf_model.layers[0].self_attn.q_proj.bias is not None


def test_a_causal_lm_checkpoint_loads_without_a_pooling_config(hf_model, tmp_path: Path) -> None:
    lm = transformers.Qwen2ForCausalLM(_config()).eval()
    lm.model.load_state_dict(hf_model.state_dict())
    path = save_model_dir(lm, tmp_path / "lm", VOCAB)
    card = read_card(path)
    assert (card.causal, card.pooling, card.max_input_tokens) == (True, "last", 512)
    seqs = random_seqs(VOCAB, LENGTHS, seed=54)
    assert_matches_reference(
        Engine.load(path).embed(*pack(seqs)), reference_pooled(hf_model, seqs, "last")
    )


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"use_sliding_window": True}, "sliding-window"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "'yarn'"),
    ],
)
def test_options_we_do_not_run_are_refused_by_name(hf_model, tmp_path, changes, named) -> None:
    path = save_model_dir(hf_model, tmp_path / "x", VOCAB, "last", changes)
    with pytest.raises(NotImplementedError, match=named):
        Engine.load(path)

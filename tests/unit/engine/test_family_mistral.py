"""Our Mistral embedder beyond the family table's comparison (``test_families.py``: causal,
last-token pooling, as e5-mistral): the card keeps inputs within the sliding window that it
does not run; refusals by name."""

from __future__ import annotations

from pathlib import Path

import family_table
import pytest
from engine_helpers import (
    save_model_dir,
)

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 500
WINDOW = 96
LENGTHS = [1, 2, 7, 19, 64, 3, WINDOW, 33]


def _config() -> transformers.MistralConfig:
    return family_table.config(family_table.MISTRAL)


@pytest.fixture(scope="module")
def lm() -> transformers.MistralForCausalLM:
    return family_table.hf_model(family_table.MISTRAL)


def test_inputs_are_capped_at_the_sliding_window(lm, tmp_path: Path) -> None:
    assert read_card(save_model_dir(lm, tmp_path / "w", VOCAB)).max_input_tokens == WINDOW
    path = save_model_dir(lm, tmp_path / "none", VOCAB, config_changes={"sliding_window": None})
    assert read_card(path).max_input_tokens == 512


def test_another_activation_is_refused_by_name(lm, tmp_path: Path) -> None:
    path = save_model_dir(lm, tmp_path / "a", VOCAB, "last", {"hidden_act": "gelu"})
    with pytest.raises(NotImplementedError, match="mistral: hidden_act 'gelu'"):
        Engine.load(path)

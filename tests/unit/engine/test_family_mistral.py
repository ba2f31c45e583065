"""Our Mistral embedder equals transformers in fp32 (causal, last-token pooling, as
e5-mistral), and the card keeps inputs within the sliding window that it does not run."""

from __future__ import annotations

from pathlib import Path

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

VOCAB = 500
WINDOW = 96
LENGTHS = [1, 2, 7, 19, 64, 3, WINDOW, 33]


def _config() -> transformers.MistralConfig:
    return transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,  # not hidden / heads: the config's head_dim is read
        rope_theta=1000.0,
        max_position_embeddings=512,
        sliding_window=WINDOW,
        attn_implementation="eager",
    )


@pytest.fixture(scope="module")
def lm() -> transformers.MistralForCausalLM:
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(_config()).eval()
    randomize(model, seed=61)
    return model


def test_causal_last_token_pooling_of_a_causal_lm_matches_transformers(lm, tmp_path) -> None:
    engine = Engine.load(save_model_dir(lm, tmp_path / "m", VOCAB, "last"))
    card = engine.card
    assert (card.family, card.causal, card.pooling) == ("mistral", True, "last")
    seqs = random_seqs(VOCAB, LENGTHS, seed=62)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(lm.model, seqs, "last"))


def test_inputs_are_capped_at_the_sliding_window(lm, tmp_path: Path) -> None:
    assert read_card(save_model_dir(lm, tmp_path / "w", VOCAB)).max_input_tokens == WINDOW
    path = save_model_dir(lm, tmp_path / "none", VOCAB, config_changes={"sliding_window": None})
    assert read_card(path).max_input_tokens == 512


def test_another_activation_is_refused_by_name(lm, tmp_path: Path) -> None:
    path = save_model_dir(lm, tmp_path / "a", VOCAB, "last", {"hidden_act": "gelu"})
    with pytest.raises(NotImplementedError, match="mistral: hidden_act 'gelu'"):
        Engine.load(path)

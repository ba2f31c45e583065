"""Our Qwen2 embedder (q/k/v biases, no q/k norm) equals transformers in fp32, causal with
last-token pooling and bidirectional with mean pooling, and refuses what it does not run."""

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
LENGTHS = [1, 2, 7, 19, 64, 3, 130, 33]


def _config() -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000.0,
        max_position_embeddings=512,
        attn_implementation="eager",
    )


@pytest.fixture(scope="module")
def hf_model() -> transformers.Qwen2Model:
    torch.manual_seed(0)
    model = transformers.Qwen2Model(_config()).eval()
    randomize(model, seed=51)
    return model


def test_causal_last_token_pooling_matches_transformers(hf_model, tmp_path: Path) -> None:
    assert hf_model.layers[0].self_attn.q_proj.bias is not None  # the biases are exercised
    engine = Engine.load(save_model_dir(hf_model, tmp_path / "c", VOCAB, "last"))
    assert (engine.card.family, engine.card.causal, engine.card.pooling) == ("qwen2", True, "last")
    seqs = random_seqs(VOCAB, LENGTHS, seed=52)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf_model, seqs, "last"))


def test_bidirectional_mean_pooling_matches_transformers(hf_model, tmp_path: Path) -> None:
    path = save_model_dir(hf_model, tmp_path / "b", VOCAB, config_changes={"is_causal": False})
    engine = Engine.load(path)
    assert (engine.card.causal, engine.card.pooling) == (False, "mean")
    seqs = random_seqs(VOCAB, LENGTHS, seed=53)
    ref = []
    for seq in seqs:
        # A mask mapping is used as given: zeros let every token see every other one.
        zeros = torch.zeros(1, 1, len(seq), len(seq))
        ref.append(
            reference_pooled(hf_model, [seq], "mean", attention_mask={"full_attention": zeros})
        )
    assert_matches_reference(engine.embed(*pack(seqs)), torch.cat(ref))


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

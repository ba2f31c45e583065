"""Our Gemma 3 embedder equals transformers' Gemma3TextModel in fp32: bidirectional as
EmbeddingGemma (mean pooled, the local layers' window either side) and causal (last token),
sandwich norms, q/k norms, query_pre_attn_scalar, a theta per layer kind; refusals by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import (
    MaskFreeSdpa,
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

VOCAB = 300
WINDOW = 16  # as saved: bidirectional, 8 either side; causal, the 16 most recent keys
LENGTHS = [1, 5, 2, 77, 9, 17, 120, 33]


def _model(seed: int, bidirectional: bool) -> transformers.Gemma3TextModel:
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,  # not head_dim: the scores' scale is the config's
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=WINDOW,
        max_position_embeddings=256,
        use_bidirectional_attention=bidirectional,
        pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.Gemma3TextModel(config).eval()
    randomize(model, seed=seed)
    return model


@pytest.fixture(scope="module")
def embedding_gemma() -> transformers.Gemma3TextModel:
    return _model(seed=91, bidirectional=True)


def test_bidirectional_mean_pooling_matches_transformers(embedding_gemma, tmp_path) -> None:
    engine = Engine.load(save_model_dir(embedding_gemma, tmp_path / "m", VOCAB, "mean"))
    card = engine.card
    assert (card.family, card.causal, card.pooling) == ("gemma3", False, "mean")
    assert [layer.window for layer in engine.model.layers] == [8, None, 8]
    seqs = random_seqs(VOCAB, LENGTHS, seed=92)
    ref = reference_pooled(embedding_gemma, seqs, "mean")
    assert_matches_reference(engine.embed(*pack(seqs)), ref)


def test_the_window_and_the_query_scale_matter(embedding_gemma, tmp_path: Path) -> None:
    # Without either the output moves: the comparison above really checks both.
    engine = Engine.load(save_model_dir(embedding_gemma, tmp_path / "w", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, [60], seed=96)
    ours = engine.embed(*pack(seqs))
    for layer in engine.model.layers:
        layer.window = None
    assert (engine.embed(*pack(seqs)) - ours).abs().max() > 1e-3  # tolerance: 1e-4
    engine = Engine.load(save_model_dir(embedding_gemma, tmp_path / "s", VOCAB, "mean"))
    for layer in engine.model.layers:
        layer.q_scale = 1.0
    assert (engine.embed(*pack(seqs)) - ours).abs().max() > 1e-3


def test_causal_last_token_pooling_matches_transformers(tmp_path: Path) -> None:
    hf = _model(seed=93, bidirectional=False)
    path = save_model_dir(hf, tmp_path / "c", VOCAB)
    assert (read_card(path).causal, read_card(path).pooling) == (True, "last")
    engine = Engine.load(path)
    assert [layer.window for layer in engine.model.layers] == [WINDOW - 1, None, WINDOW - 1]
    seqs = random_seqs(VOCAB, LENGTHS, seed=94)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf, seqs, "last"))


@pytest.mark.parametrize(
    ("bidirectional", "pooling", "longest"),
    [(True, "mean", WINDOW // 2 + 1), (False, "last", WINDOW)],
)
def test_a_batch_no_window_cuts_runs_mask_free_and_still_matches(
    embedding_gemma, tmp_path: Path, bidirectional: bool, pooling: str, longest: int
) -> None:
    # As on CUDA's fast path: the window dropped for a batch no window cuts.
    hf = embedding_gemma if bidirectional else _model(seed=97, bidirectional=False)
    path = save_model_dir(hf, tmp_path / "f", VOCAB, "mean" if bidirectional else None)
    masked, free = Engine.load(path), Engine.load(path, attention=MaskFreeSdpa())
    assert (free.card.pooling, free.model.mask_free_length) == (pooling, longest)
    seqs = random_seqs(VOCAB, [1, 5, longest, 2, longest - 1, longest], seed=98)
    ours = free.embed(*pack(seqs))
    torch.testing.assert_close(ours, masked.embed(*pack(seqs)), rtol=1e-5, atol=1e-5)
    assert_matches_reference(ours, reference_pooled(hf, seqs, pooling))
    # One token longer and the window binds: only the masked forward still matches.
    seqs = random_seqs(VOCAB, [longest + 1], seed=99)
    ref = reference_pooled(hf, seqs, pooling)
    assert_matches_reference(masked.embed(*pack(seqs)), ref)
    assert (free.embed(*pack(seqs)) - ref).abs().max() > 1e-3  # tolerance: 1e-4


def test_a_causal_lm_checkpoint_with_the_model_prefix_loads(embedding_gemma, tmp_path) -> None:
    lm = transformers.Gemma3ForCausalLM(embedding_gemma.config).eval()
    lm.model.load_state_dict(embedding_gemma.state_dict())
    engine = Engine.load(save_model_dir(lm, tmp_path / "lm", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, LENGTHS, seed=95)
    ref = reference_pooled(embedding_gemma, seqs, "mean")
    assert_matches_reference(engine.embed(*pack(seqs)), ref)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"hidden_activation": "quick_gelu"}, "hidden_act 'quick_gelu'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_type 'linear'"),
    ],
)
def test_options_we_do_not_run_are_refused_by_name(
    embedding_gemma, tmp_path, changes, named
) -> None:
    path = save_model_dir(embedding_gemma, tmp_path / "x", VOCAB, "mean", changes)
    with pytest.raises(NotImplementedError, match=named):
        Engine.load(path)

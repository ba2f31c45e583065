"""Our Gemma 3 embedder beyond the family table's comparison with Gemma3TextModel
(``test_families.py``: bidirectional as EmbeddingGemma, causal): the window and the
query_pre_attn_scalar must matter, a batch no window cuts runs mask-free and still matches, a
causal-LM checkpoint loads, refusals by name."""

from __future__ import annotations

from pathlib import Path

import family_table
import pytest
import torch
from engine_helpers import (
    MaskFreeSdpa,
    assert_matches_reference,
    pack,
    random_seqs,
    reference_pooled,
    save_model_dir,
)

from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 300
WINDOW = 16  # as saved: bidirectional, 8 either side; causal, the 16 most recent keys
LENGTHS = [1, 5, 2, 77, 9, 17, 120, 33]


def _model(seed: int, bidirectional: bool) -> transformers.Gemma3TextModel:
    row = family_table.EMBEDDING_GEMMA if bidirectional else family_table.CAUSAL_GEMMA
    return family_table.build(row, seed)


@pytest.fixture(scope="module")
def embedding_gemma() -> transformers.Gemma3TextModel:
    return family_table.hf_model(family_table.EMBEDDING_GEMMA)


def test_the_window_and_the_query_scale_matter(embedding_gemma, tmp_path: Path) -> None:
    # Without either the output moves: the family table's comparison really checks both.
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

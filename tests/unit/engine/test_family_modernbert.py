"""Our ModernBERT encoder beyond the family table's comparison (``test_families.py``: rotary
positions with a theta per layer kind, local windows, GeGLU, the first layer without an
attention norm): the window must matter, a batch no window cuts runs mask-free and still
matches, biases everywhere, older Hub configs, a masked-LM checkpoint; refusals by name."""

from __future__ import annotations

import json
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
LOCAL = 16  # a window of 8 tokens either side: most sequences below are longer
LENGTHS = [1, 5, 2, 77, 9, 16, 120, 17]


def _config(**kw) -> transformers.ModernBertConfig:  # noqa: ANN003
    return family_table.config(family_table.MODERNBERT, **kw)


def _model(seed: int, **kw) -> transformers.ModernBertModel:  # noqa: ANN003
    return family_table.build(family_table.MODERNBERT, seed, **kw)


@pytest.fixture(scope="module")
def hf_model() -> transformers.ModernBertModel:
    return family_table.hf_model(family_table.MODERNBERT)


def test_the_window_matters(hf_model, tmp_path: Path) -> None:
    # Without it the output moves: the family table's comparison really checks the local layers.
    engine = Engine.load(save_model_dir(hf_model, tmp_path / "w", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, [60], seed=77)
    windowed = engine.embed(*pack(seqs))
    for layer in engine.model.layers:
        layer.window = None
    assert (engine.embed(*pack(seqs)) - windowed).abs().max() > 1e-3  # tolerance: 1e-4


def test_a_batch_no_window_cuts_runs_mask_free_and_still_matches(hf_model, tmp_path) -> None:
    # As on CUDA's fast path: the window dropped for a batch of sequences of at most 9 tokens.
    path = save_model_dir(hf_model, tmp_path / "f", VOCAB, "mean")
    masked, free = Engine.load(path), Engine.load(path, attention=MaskFreeSdpa())
    longest = free.model.mask_free_length
    assert (longest, free.model.needs_masks) == (LOCAL // 2 + 1, True)
    seqs = random_seqs(VOCAB, [1, 5, longest, 2, longest - 1, longest], seed=78)
    ours = free.embed(*pack(seqs))
    torch.testing.assert_close(ours, masked.embed(*pack(seqs)), rtol=1e-5, atol=1e-5)
    assert_matches_reference(ours, reference_pooled(hf_model, seqs, "mean"))
    # One token longer and the window binds: only the masked forward still matches.
    seqs = random_seqs(VOCAB, [longest + 1], seed=79)
    ref = reference_pooled(hf_model, seqs, "mean")
    assert_matches_reference(masked.embed(*pack(seqs)), ref)
    assert (free.embed(*pack(seqs)) - ref).abs().max() > 1e-3  # tolerance: 1e-4


def test_biases_everywhere_load_and_match(tmp_path: Path) -> None:
    hf = _model(seed=73, norm_bias=True, attention_bias=True, mlp_bias=True)
    engine = Engine.load(save_model_dir(hf, tmp_path / "b", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, LENGTHS, seed=74)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf, seqs, "mean"))


def test_an_older_hub_config_reads_the_same(hf_model, tmp_path: Path) -> None:
    # As answerdotai/ModernBERT-base's config.json: no layer_types, thetas by name.
    path = save_model_dir(hf_model, tmp_path / "old", VOCAB, "mean")
    config = json.loads((path / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        config.pop(key)
    config |= {"global_attn_every_n_layers": 3, "global_rope_theta": 160000.0}
    config |= {"local_rope_theta": 10000.0}
    (path / "config.json").write_text(json.dumps(config))
    seqs = random_seqs(VOCAB, LENGTHS, seed=75)
    ref = reference_pooled(hf_model, seqs, "mean")
    assert_matches_reference(Engine.load(path).embed(*pack(seqs)), ref)


def test_a_masked_lm_checkpoint_with_the_model_prefix_loads(hf_model, tmp_path: Path) -> None:
    mlm = transformers.ModernBertForMaskedLM(_config()).eval()
    mlm.model.load_state_dict(hf_model.state_dict())
    engine = Engine.load(save_model_dir(mlm, tmp_path / "mlm", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, LENGTHS, seed=76)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf_model, seqs, "mean"))


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"hidden_activation": "quick_gelu"}, "hidden_act 'quick_gelu'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_type 'linear'"),
        ({"layer_types": ["full_attention", "chunked_attention"] * 2}, "layer_types"),
    ],
)
def test_options_we_do_not_run_are_refused_by_name(hf_model, tmp_path, changes, named) -> None:
    path = save_model_dir(hf_model, tmp_path / "x", VOCAB, "mean", changes)
    with pytest.raises(NotImplementedError, match=named):
        Engine.load(path)

"""Our MPNet encoder equals transformers in fp32: relative position buckets (near and far
beyond the 128 of the largest bucket), positions after the pad id, a masked-LM checkpoint."""

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

from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 300
# Up to the whole table: relative distances past 128 fall in the last buckets.
LENGTHS = [1, 5, 2, 200, 16, 9, 298]


def _config() -> transformers.MPNetConfig:
    return transformers.MPNetConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=300,
    )


@pytest.fixture(scope="module")
def hf_model() -> transformers.MPNetModel:
    torch.manual_seed(0)
    model = transformers.MPNetModel(_config()).eval()
    randomize(model, seed=41)
    return model


def _seqs(seed: int) -> list[list[int]]:
    seqs = random_seqs(VOCAB, LENGTHS, seed=seed)
    seqs[3][50:52] = [1, 1]  # pad ids: the pad position row, later positions shifted
    return seqs


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooled_output_matches_transformers(hf_model, tmp_path: Path, pooling: str) -> None:
    engine = Engine.load(save_model_dir(hf_model, tmp_path / pooling, VOCAB, pooling))
    assert (engine.card.family, engine.card.max_input_tokens) == ("mpnet", 298)
    assert engine.model.needs_masks
    seqs = _seqs(seed=42)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf_model, seqs, pooling))


def test_the_relative_bias_matters(hf_model, tmp_path: Path) -> None:
    # Without it the output moves: the comparison above really checks the buckets.
    engine = Engine.load(save_model_dir(hf_model, tmp_path / "m", VOCAB, "mean"))
    seqs = random_seqs(VOCAB, [40], seed=43)
    with_bias = engine.embed(*pack(seqs))
    engine.model.rel_bias = None
    assert (engine.embed(*pack(seqs)) - with_bias).abs().max() > 1e-3  # tolerance: 1e-4


def test_a_masked_lm_checkpoint_with_the_mpnet_prefix_loads(hf_model, tmp_path: Path) -> None:
    mlm = transformers.MPNetForMaskedLM(_config()).eval()
    mlm.mpnet.load_state_dict(hf_model.state_dict(), strict=False)
    engine = Engine.load(save_model_dir(mlm, tmp_path / "mlm", VOCAB, "mean"))
    seqs = _seqs(seed=44)
    assert_matches_reference(engine.embed(*pack(seqs)), reference_pooled(hf_model, seqs, "mean"))


def test_too_few_relative_buckets_are_refused(hf_model, tmp_path: Path) -> None:
    changes = {"relative_attention_num_buckets": 16}
    path = save_model_dir(hf_model, tmp_path / "b", VOCAB, "mean", changes)
    with pytest.raises(NotImplementedError, match="relative_attention_num_buckets 16"):
        Engine.load(path)


def test_another_activation_is_refused_by_name(hf_model, tmp_path: Path) -> None:
    path = save_model_dir(hf_model, tmp_path / "a", VOCAB, "mean", {"hidden_act": "silu"})
    with pytest.raises(NotImplementedError, match="mpnet: hidden_act 'silu'"):
        Engine.load(path)

"""Our MPNet encoder beyond the family table's comparison (``test_families.py``: relative
position buckets near and far beyond 128, positions after the pad id): the bias must matter,
a masked-LM checkpoint loads; refusals by name."""

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

from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 300
# Up to the whole table: relative distances past 128 fall in the last buckets.
LENGTHS = [1, 5, 2, 200, 16, 9, 298]


def _config() -> transformers.MPNetConfig:
    return family_table.config(family_table.MPNET)


@pytest.fixture(scope="module")
def hf_model() -> transformers.MPNetModel:
    return family_table.hf_model(family_table.MPNET)


def _seqs(seed: int) -> list[list[int]]:
    seqs = random_seqs(VOCAB, LENGTHS, seed=seed)
    seqs[3][50:52] = [1, 1]  # pad ids: the pad position row, later positions shifted
    return seqs


def test_the_relative_bias_matters(hf_model, tmp_path: Path) -> None:
    # Without it the output moves: the family table's comparison really checks the buckets.
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

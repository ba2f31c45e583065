"""Our Qwen3 embedder beyond the family table's comparison with Qwen3Model
(``test_families.py``: causal and bidirectional): the bidirectional reference really is,
the two modes differ, a mean pooling config means bidirectional, sharded causal-LM
checkpoints, bf16 close to fp32."""

from __future__ import annotations

import json
from pathlib import Path

import family_table
import numpy as np
import pytest
import torch
from engine_helpers import cosines, pack, random_seqs, write_word_tokenizer

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 1000
LENGTHS = [1, 2, 7, 19, 64, 3, 130, 33]


@pytest.fixture(scope="module")
def hf_model() -> transformers.Qwen3Model:
    return family_table.hf_model(family_table.QWEN3)


def _save(model: torch.nn.Module, path: Path, extra: dict | None = None, **kw) -> Path:
    model.save_pretrained(path, safe_serialization=True, **kw)
    if extra:
        config = json.loads((path / "config.json").read_text())
        config.update(extra)
        (path / "config.json").write_text(json.dumps(config))
    write_word_tokenizer(path, VOCAB)
    return path


@pytest.fixture(scope="module")
def causal_dir(hf_model, tmp_path_factory) -> Path:
    return _save(hf_model, tmp_path_factory.mktemp("qwen3-causal"))


@pytest.fixture(scope="module")
def bidirectional_dir(hf_model, tmp_path_factory) -> Path:
    return _save(hf_model, tmp_path_factory.mktemp("qwen3-bidi"), {"is_causal": False})


def _hf_hidden(model: transformers.Qwen3Model, seq: list[int], causal: bool) -> torch.Tensor:
    ids = torch.tensor([seq])
    with torch.no_grad():
        if causal:
            return model(input_ids=ids).last_hidden_state[0]
        # A mask mapping is used as is by Qwen3Model (no causal mask is built): an additive
        # float mask of zeros lets every token see every other one.
        zeros = torch.zeros(1, 1, len(seq), len(seq))
        return model(input_ids=ids, attention_mask={"full_attention": zeros}).last_hidden_state[0]


def test_the_bidirectional_comparison_really_exercises_non_causal_attention(hf_model) -> None:
    # If the zero mask were ignored, the reference would be causal and both modes would
    # agree token for token. The first token, which sees only itself when causal, must move.
    seq = random_seqs(VOCAB, [40], seed=4)[0]
    causal = _hf_hidden(hf_model, seq, causal=True)
    bidi = _hf_hidden(hf_model, seq, causal=False)
    assert cosines(causal, bidi).max() < 0.99
    assert cosines(causal[:1], bidi[:1]).max() < 0.9


def test_both_modes_of_our_engine_differ(causal_dir: Path, bidirectional_dir: Path) -> None:
    seqs = random_seqs(VOCAB, [40], seed=5)
    causal = Engine.load(causal_dir).embed(*pack(seqs))
    bidi = Engine.load(bidirectional_dir).embed(*pack(seqs))
    assert cosines(causal, bidi).max() < 0.99


def test_mean_pooling_config_without_a_flag_means_bidirectional(hf_model, tmp_path) -> None:
    path = _save(hf_model, tmp_path / "m")
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": True, "word_embedding_dimension": 64})
    )
    card = read_card(path)
    assert (card.causal, card.pooling, card.normalize) == (False, "mean", False)


def test_a_causal_lm_checkpoint_in_shards_loads_the_same_weights(
    hf_model, causal_dir: Path, tmp_path: Path
) -> None:
    # Qwen3ForCausalLM prefixes the backbone with "model." and adds lm_head; a small shard
    # size forces model.safetensors.index.json.
    lm = transformers.Qwen3ForCausalLM(family_table.config(family_table.QWEN3)).eval()
    lm.model.load_state_dict(hf_model.state_dict())
    path = _save(lm, tmp_path / "lm", max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    seqs = random_seqs(VOCAB, LENGTHS, seed=6)
    ours = Engine.load(path).embed(*pack(seqs))
    ref = Engine.load(causal_dir).embed(*pack(seqs))
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_bfloat16_stays_close_to_float32(causal_dir: Path) -> None:
    seqs = random_seqs(VOCAB, LENGTHS, seed=7)
    full = Engine.load(causal_dir).embed(*pack(seqs))
    engine = Engine.load(causal_dir, dtype=torch.bfloat16)
    assert engine.dtype == torch.bfloat16
    half = engine.embed(*pack(seqs))
    assert half.dtype == torch.float32
    assert np.min(cosines(full, half)) > 0.99

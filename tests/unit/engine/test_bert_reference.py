"""Our BERT encoder loads what BertModel's checkpoints come as: a masked-LM checkpoint with
the ``bert.`` prefix, half-precision weights (the family table checks the pooled output)."""

from __future__ import annotations

import json
from pathlib import Path

import family_table
import pytest
import torch
from engine_helpers import pack, random_seqs, write_word_tokenizer
from safetensors import safe_open

from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 500
LENGTHS = [1, 5, 2, 77, 16, 120, 9]


@pytest.fixture(scope="module")
def hf_model() -> transformers.BertModel:
    return family_table.hf_model(family_table.BERT)


def _save(model: torch.nn.Module, path: Path, pooling: str) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    write_word_tokenizer(path, VOCAB)
    flag = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}[pooling]
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({flag: True}))
    return path


def _hf_hidden(model: transformers.BertModel, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).last_hidden_state[0]


def test_a_masked_lm_checkpoint_with_the_bert_prefix_loads(hf_model, tmp_path: Path) -> None:
    mlm = transformers.BertForMaskedLM(family_table.config(family_table.BERT)).eval()
    mlm.bert.load_state_dict(hf_model.state_dict(), strict=False)
    engine = Engine.load(_save(mlm, tmp_path / "mlm", "mean"))
    seqs = random_seqs(VOCAB, LENGTHS, seed=13)
    ref = torch.stack([_hf_hidden(hf_model, s).mean(0) for s in seqs])
    torch.testing.assert_close(engine.embed(*pack(seqs)), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16])
def test_a_half_precision_checkpoint_loads_into_float32(hf_model, tmp_path: Path, stored) -> None:
    # The reference is the same model with its weights rounded to the stored dtype, in fp32.
    rounded = transformers.BertModel(family_table.config(family_table.BERT)).eval()
    rounded.load_state_dict({k: v.to(stored).float() for k, v in hf_model.state_dict().items()})
    path = _save(rounded.to(stored), tmp_path / "half", "mean")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert f.get_tensor("embeddings.word_embeddings.weight").dtype == stored
    engine = Engine.load(path)
    assert engine.dtype == torch.float32
    seqs = random_seqs(VOCAB, LENGTHS, seed=14)
    ref = torch.stack([_hf_hidden(rounded.float(), s).mean(0) for s in seqs])
    torch.testing.assert_close(engine.embed(*pack(seqs)), ref, rtol=1e-4, atol=1e-4)

"""Every family equals transformers in fp32, from one table of tiny configs
(``family_table.FAMILIES``): the card and the model base say what the row expects, and a
packed batch of random sequences pools as transformers' output of each sequence alone.
Each family's own file keeps what does not fit a row (checkpoint layouts, refusals,
windows and biases that must matter, kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import assert_matches_reference, pack, reference_pooled, save_model_dir
from family_table import BIDIRECTIONAL, FAMILIES, Family, hf_model, sequences

from mesh.worker.engine.engine import Engine

pytest.importorskip("transformers")


def _reference(row: Family, seqs: list[list[int]]) -> torch.Tensor:
    model = hf_model(row.model)
    backbone = getattr(model, row.backbone) if row.backbone else model
    if row.reference != BIDIRECTIONAL:
        return reference_pooled(backbone, seqs, row.pooling)
    # A mask mapping is used as given by transformers' decoders (no causal mask is built):
    # zeros let every token see every other one.
    return torch.cat(
        [
            reference_pooled(
                backbone,
                [seq],
                row.pooling,
                attention_mask={"full_attention": torch.zeros(1, 1, len(seq), len(seq))},
            )
            for seq in seqs
        ]
    )


@pytest.mark.parametrize("row", FAMILIES, ids=[row.name for row in FAMILIES])
def test_the_family_matches_transformers(row: Family, tmp_path: Path) -> None:
    pooling = row.pooling if row.save_pooling else None
    path = save_model_dir(
        hf_model(row.model), tmp_path / row.name, row.vocab, pooling, row.config_changes
    )
    engine = Engine.load(path)
    card = engine.card
    assert (card.family, card.causal, card.pooling) == (row.family, row.causal, row.pooling)
    if row.max_input_tokens is not None:
        assert card.max_input_tokens == row.max_input_tokens
    if row.windows is not None:
        assert engine.model.windows == row.windows
        assert [layer.window for layer in engine.model.layers] == list(row.windows)
    assert engine.model.needs_masks == (row.windows is not None or row.family == "mpnet")
    seqs = sequences(row)
    assert_matches_reference(engine.embed(*pack(seqs)), _reference(row, seqs))

"""bge-m3's lexical weights on CUDA in bf16 (the batch runs eagerly to keep its hidden states,
the head and the max in fp32) against FlagEmbedding's formula over transformers'
``XLMRobertaModel`` in fp32 on the GPU: the weights of each text close to fp32's, the same ids
kept but for weights within bf16's rounding of zero, the top-k rows built on the device; and
the dense vectors of the same forward close to the graph path's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads.lexical import HEAD_FILE, special_ids
from mesh.worker.engine.heads.sparse import sparse_rows
from tests.st_models import build_m3_lexical
from tests.unit.engine.engine_helpers import tokenized

TEXTS = [
    "what are bge-m3's lexical weights",
    "CUDA graphs replay a captured sequence of kernels with one launch.",
    "a",
    "the the lexical head weighs every token; " * 12,
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64: FlashInfer's fa2 tiling.
    return build_m3_lexical(tmp_path_factory.mktemp("gpu-m3") / "m3", hidden=128, heads=2)


def _packed(engine: Engine) -> tuple[np.ndarray, np.ndarray]:
    return tokenized(engine.card.tokenizer_json, TEXTS)


def _reference(model_dir: Path, ids: np.ndarray, offsets: np.ndarray, vocab: int) -> np.ndarray:
    import transformers
    from safetensors.torch import load_file

    model = transformers.XLMRobertaModel.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to("cuda").eval()
    head = {k: v.cuda() for k, v in load_file(str(model_dir / HEAD_FILE)).items()}
    rows = np.zeros((len(offsets) - 1, vocab), dtype=np.float32)
    for i in range(len(offsets) - 1):
        seq = ids[offsets[i] : offsets[i + 1]].astype(np.int64)
        with torch.no_grad():
            hidden = model(input_ids=torch.from_numpy(seq)[None].cuda()).last_hidden_state[0]
            weights = torch.relu(hidden @ head["weight"].T + head["bias"])[:, 0].cpu().numpy()
        np.maximum.at(rows[i], seq, weights)
    rows[:, special_ids(model_dir)] = 0.0
    return rows


def test_bf16_lexical_weights_match_fp32_flag_embedding_formula_on_the_gpu(
    model_dir: Path,
) -> None:
    engine = Engine.load(model_dir, device="cuda")
    assert engine.dtype == torch.bfloat16 and engine.lexical is not None
    ids, offsets = _packed(engine)
    pooled, weights = engine.embed_lexical(ids, offsets)
    ours = weights.cpu().numpy()
    ref = _reference(model_dir, ids, offsets, engine.vocab_size)
    for got, want in zip(ours, ref, strict=True):
        tiny = 0.01 * float(ref.max())
        if want.max() < tiny:
            # Every weight of the text is within bf16's rounding of 0 (the one-word text "a":
            # fp32 gives its one token 0.0034 where other texts reach 14.6, bf16 gave 0 on the
            # H200): nothing to compare a direction with; bf16 must not invent a weight.
            assert got.max() < tiny, got.max()
            continue
        cos = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
        assert cos >= 0.999, cos
        # Ids whose fp32 weight is clearly above zero are kept, and only near-zero ones differ.
        assert set(np.flatnonzero(want > 0.05 * want.max())) <= set(np.flatnonzero(got))
        assert set(np.flatnonzero(got)) ^ set(np.flatnonzero(want)) <= set(
            np.flatnonzero(np.maximum(got, want) < 0.05 * want.max())
        )
    rows = sparse_rows(weights, top_k=8).cpu().numpy()
    k = rows.shape[1] // 2  # the most pairs a row kept: at most 8
    assert 1 <= k <= 8
    for row, w in zip(rows, weights.cpu().numpy(), strict=True):
        kept = row[k:] > 0
        assert kept.any() == w.any() and np.all(np.diff(row[:k][kept]) > 0)
    # The eager forward's pooled vectors are the graph path's.
    dense = engine.embed(ids, offsets).float()
    cos = torch.nn.functional.cosine_similarity(pooled.float(), dense, dim=1)
    assert cos.min().item() >= 0.999, cos

"""ColBERT checkpoints on CUDA in bf16: one batch of queries (their [MASK] expansion no token
attends to) and documents runs eagerly, its keys planned per sequence on FlashInfer's eager
ragged prefill (head_dim 64) or torch's varlen attention (head_dim 32), and every token's
vector equals colbert-ai's / PyLate's formula over transformers' fp32 BertModel (cos >= 0.999
per vector). A batch with such keys never replays a graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.engine import Engine
from mesh.worker.engine.kernels.flashinfer_attention import FlashInferRagged, TorchVarlen
from tests.colbert_reference import colbert_reference, served_vectors
from tests.st_models import build_colbert_ai, build_pylate

TEXTS = ["late interaction, over tokens!", "Grüße aus München", "a", "word " * 30]
# (builder, hidden, heads): head_dim 64 takes FlashInfer, 32 torch's varlen attention.
SHAPES = {
    "colbert-ai-fa2": (build_colbert_ai, 128, 2),
    "pylate-fa2": (build_pylate, 128, 2),
    "pylate-varlen": (build_pylate, 64, 2),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    build, hidden, heads = SHAPES[request.param]
    return build(tmp_path_factory.mktemp(request.param) / "m", hidden=hidden, heads=heads)


def test_queries_and_documents_in_bf16_equal_the_formula_in_fp32(model_dir: Path) -> None:
    engine = Engine.load(model_dir, device="cuda")
    assert engine.runner is not None
    backend = engine.runner.eager_attn
    head_dim = engine.runner.heads[2]
    assert isinstance(backend, FlashInferRagged if head_dim == 64 else TorchVarlen)
    roles = [True, False] * len(TEXTS)
    texts = [t for t in TEXTS for _ in range(2)]
    expected = [
        x
        for pair in zip(
            colbert_reference(model_dir, TEXTS, True),
            colbert_reference(model_dir, TEXTS, False),
            strict=True,
        )
        for x in pair
    ]
    for _ in range(2):  # the second time too: keys never take a graph
        ours = served_vectors(engine, texts, roles)
        for (got, ids), (ref, ref_ids) in zip(ours, expected, strict=True):
            np.testing.assert_array_equal(ids, ref_ids)
            cos = torch.nn.functional.cosine_similarity(
                torch.from_numpy(got), torch.from_numpy(ref), dim=1
            )
            assert cos.min().item() >= 0.999, cos
    assert engine.runner.graph_batches == 0 and engine.runner.eager_batches == 2


def test_a_graph_wrapper_refuses_keys(model_dir: Path) -> None:
    engine = Engine.load(model_dir, device="cuda")
    heads, dtype = engine.runner.heads, engine.dtype  # type: ignore[union-attr]
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    if heads[2] == 64:
        graph = FlashInferRagged(heads, dtype, engine.device, capacity=(4, 16))
    else:
        graph = TorchVarlen(heads, engine.device, 16, capacity=(4, 16))
    with pytest.raises(ValueError, match="keys"):
        graph.plan(cu, False, keys=np.array([3, 4]))

"""The sentence-transformers pipeline on CUDA: every pooling mode (and several concatenated), a
prompt left out of the pooling and a Dense layer, captured in a graph and run eagerly, equal to
the fp32 CPU engine (which tests/unit/engine/test_st_pipeline.py holds to sentence-transformers)
within bf16's error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.worker.engine.engine import Engine
from tests.st_models import PROMPTS, DenseSpec, build_st_model, build_tiny_bert

SPECS = ["mean", "cls", "lasttoken", "max", "mean_sqrt_len_tokens", "weightedmean"]
LENGTHS = [5, 17, 60, 9, 33]
SKIP = [2, 3, 3, 1, 4]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64: FlashInfer's fa2 tiling.
    return build_tiny_bert(tmp_path_factory.mktemp("gpu-bert"), hidden=128, heads=2)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=sum(LENGTHS)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
    return ids, offsets


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double().cpu(), b.double().cpu(), dim=1)


@pytest.mark.parametrize("pooling", [*SPECS, ("cls", "max", "mean", "weightedmean")])
@pytest.mark.parametrize("skip", [None, SKIP], ids=["all-tokens", "prompt-left-out"])
def test_graph_and_eager_pooling_with_dense_equal_the_cpu_engine(
    bert_dir: Path, tmp_path: Path, pooling, skip
) -> None:
    path = build_st_model(
        bert_dir, tmp_path / "m", pooling=pooling, dense=[DenseSpec(48, "Tanh")],
        prompts=PROMPTS, include_prompt=skip is None, normalize=False,
    )  # fmt: skip
    ids, offsets = _batch()
    skip_a = None if skip is None else np.array(skip, dtype=np.int64)
    want = Engine.load(path).embed(ids, offsets, skip_a)
    graphed = Engine.load(path, device="cuda")
    graphed.warmup([len(ids)])
    got_graph = graphed.embed(ids, offsets, skip_a)
    assert graphed.runner.graph_batches == 1
    eager = Engine.load(path, device="cuda", graphs=False)
    got_eager = eager.embed(ids, offsets, skip_a)
    for got in (got_graph, got_eager):
        assert got.shape == want.shape == (len(LENGTHS), 48)
        assert _cos(got, want).min() >= 0.999
    torch.testing.assert_close(got_graph, got_eager, rtol=2e-2, atol=2e-2)

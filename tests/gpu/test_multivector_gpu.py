"""bge-m3's colbert vectors on CUDA in bf16: a batch asking for them is a span batch (its
bucket's first runs eagerly, the next replays the bucket's span graph), the head runs in fp32 on
the device, and each token's vector equals FlagEmbedding's formula on transformers' fp32 hidden
states on the GPU (cos >= 0.999 per vector), eager and replayed; a plain group of the same
batch gets its pooled rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mesh.client.spans import token_spans
from mesh.worker.engine.engine import Engine
from mesh.worker.pipeline import ResultPipeline
from proto_msgs import BatchAssign, OutputOptions
from tests.st_models import build_m3_colbert

SEQS = [[101, *range(2000, 2040), 102], [101, *range(3000, 3011), 102], [101, 4000, 102]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64: FlashInfer's fa2 tiling.
    return build_m3_colbert(tmp_path_factory.mktemp("gpu-m3") / "m3", hidden=128, heads=2)


def _reference(model_dir: Path, seq: list[int]) -> torch.Tensor:
    import transformers

    hf = transformers.XLMRobertaModel.from_pretrained(model_dir, dtype=torch.float32)
    hf = hf.to("cuda").eval()
    head = {
        k: v.cuda() for k, v in load_file(str(model_dir / "colbert_linear.safetensors")).items()
    }
    with torch.no_grad():
        hidden = hf(input_ids=torch.tensor([seq], device="cuda")).last_hidden_state[0]
    return torch.nn.functional.normalize(hidden[1:] @ head["weight"].T + head["bias"], dim=-1)


def test_colbert_vectors_in_bf16_equal_flagembeddings_formula_in_fp32(model_dir: Path) -> None:
    engine = Engine.load(model_dir, device="cuda")
    ids = np.array([t for s in SEQS for t in s], dtype=np.int32)
    lengths = np.array([len(s) for s in SEQS])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    spans, span_offsets = token_spans(lengths[:2], first=1)
    batch = BatchAssign(
        batch_id=1, model="m", timeout_ms=10_000,
        outputs=[OutputOptions(rows="multivector"), OutputOptions()],
        output_index=np.array([0, 0, 1], np.int32), token_ids=ids, offsets=offsets,
        spans=spans, span_offsets=np.append(span_offsets, span_offsets[-1]).astype(np.int32),
    )  # fmt: skip
    pipe = ResultPipeline(engine, engine.device)
    results, _ = pipe.collect(pipe.launch(batch))
    assert engine.runner is not None and engine.runner.eager_batches == 1
    replayed, _ = pipe.collect(pipe.launch(batch))
    assert (engine.runner.eager_batches, engine.runner.graph_batches) == (1, 1)
    ref = torch.cat([_reference(model_dir, s) for s in SEQS[:2]]).cpu()
    for run in (results, replayed):
        got = torch.from_numpy(np.asarray(run[0]))
        assert got.shape == ref.shape == (int(lengths[:2].sum()) - 2, 128)
        cos = torch.nn.functional.cosine_similarity(got, ref, dim=1)
        assert cos.min().item() >= 0.999, cos
        assert np.asarray(run[1]).shape == (1, engine.card.dims)

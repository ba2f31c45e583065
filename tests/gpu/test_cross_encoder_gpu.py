"""Cross-encoders on CUDA in bf16: the logits of pairs and single texts, replayed through a
graph and run eagerly, equal transformers' ``BertForSequenceClassification`` on the GPU
(token type 1 folded into the word table, so pairs replay the same graphs), and the
re-ranker's sigmoid scores equal ``CrossEncoder.predict`` within bf16's error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mesh.client.pairs import encode_inputs
from mesh.client.scores import activate
from mesh.client.tokenize import ModelTokenizer
from mesh.worker.engine.engine import Engine
from proto_msgs import ModelInfo
from tests.st_models import MAX_TOKENS, build_cross_encoder

QUERY = "which passage answers the question about graphs"
TEXTS = [
    "CUDA graphs replay a captured sequence of kernels with one launch.",
    "The weather was mild for the season.",
    "graphs",
    "A cross-encoder reads both texts at once; a long passage that goes on " * 3,
]


@pytest.fixture(scope="module", params=[1, 3], ids=["1-label", "3-labels"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64: FlashInfer's fa2 tiling.
    root = tmp_path_factory.mktemp("gpu-ce")
    return build_cross_encoder(root / "ce", num_labels=request.param, hidden=128, heads=2)


def _batch(engine: Engine) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    card = engine.card
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, engine.vocab_size,
                     card.pooling, card.normalize, card.tokenizer_digest)  # fmt: skip
    tok = ModelTokenizer(card.tokenizer_json, info)
    inputs = [(QUERY, t) for t in TEXTS] + ["a single text to classify"]
    ids, lengths, starts = encode_inputs(tok, inputs, truncate=True)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return inputs, ids, offsets, starts


def _reference_logits(model_dir: Path, inputs: list) -> torch.Tensor:
    import transformers

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_dir, dtype=torch.bfloat16
    )
    hf = hf.to("cuda").eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    rows = []
    for x in inputs:
        enc = tok(*x, return_tensors="pt") if isinstance(x, tuple) else tok(x, return_tensors="pt")
        with torch.no_grad():
            rows.append(hf(**enc.to("cuda")).logits[0].float().cpu())
    return torch.stack(rows)


@pytest.mark.parametrize("graphs", [True, False], ids=["graph", "eager"])
def test_bf16_logits_equal_transformers_on_the_gpu(model_dir: Path, graphs: bool) -> None:
    engine = Engine.load(model_dir, device="cuda", graphs=graphs)
    inputs, ids, offsets, starts = _batch(engine)
    if graphs:
        engine.warmup([len(ids)])
    got = engine.embed(ids, offsets, pairs=starts).float().cpu()
    if graphs:
        assert engine.runner.graph_batches == 1  # pairs replay the graph
    want = _reference_logits(model_dir, inputs)
    # Both bf16 forwards, in different kernels: logits of these weights are O(1).
    torch.testing.assert_close(got, want, atol=6e-2, rtol=5e-2)
    cpu = Engine.load(model_dir).embed(ids, offsets, pairs=starts)
    torch.testing.assert_close(got, cpu, atol=6e-2, rtol=5e-2)


def test_reranker_scores_equal_cross_encoder_predict(model_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    engine = Engine.load(model_dir, device="cuda")
    if engine.card.dims != 1:
        pytest.skip("a re-ranker has one label")
    inputs, ids, offsets, starts = _batch(engine)
    pairs = inputs[:-1]
    logits = engine.embed(ids, offsets, pairs=starts).float().cpu().numpy()
    ours = activate(logits, engine.card.activation)[: len(pairs), 0]
    ref = CrossEncoder(str(model_dir), device="cuda", max_length=MAX_TOKENS).predict(pairs)
    np.testing.assert_allclose(ours, ref, atol=1e-2)

"""The CUDA engine (bf16, FlashInfer fa2, CUDA graphs) against transformers on the GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.shapes import bert_base_dir, qwen3_dir
from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

MINILM_DIR = default_model_path()  # the embedded all-MiniLM-L6-v2
LENGTHS = [1, 2, 7, 16, 33, 64, 130, 257, 512, 3, 100, 8]


def pack(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    return np.concatenate(seqs).astype(np.int32), offsets


def random_seqs(lengths: list[int], low: int, high: int, seed: int) -> list[np.ndarray]:
    gen = np.random.default_rng(seed)
    return [gen.integers(low, high, size=n) for n in lengths]


def cosines(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).cpu().numpy()


def reference(model_dir: Path, seqs: list[np.ndarray], pooling: str, **kw) -> torch.Tensor:
    """transformers in fp32 on the GPU, one sequence at a time (no padding to mask)."""
    model = transformers.AutoModel.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="sdpa", **kw
    )
    model = model.cuda().eval()
    out = []
    with torch.inference_mode():
        for s in seqs:
            ids = torch.as_tensor(s, dtype=torch.long, device="cuda")[None]
            hidden = model(input_ids=ids).last_hidden_state[0].float()
            out.append(hidden[-1] if pooling == "last" else hidden.mean(0))
    return torch.stack(out)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return bert_base_dir(tmp_path_factory.mktemp("bert-base"))


@pytest.fixture(scope="module")
def qwen3_causal_dir(tmp_path_factory) -> Path:
    return qwen3_dir(tmp_path_factory.mktemp("qwen3-causal"), causal=True, vocab_size=32000)


def _check_close(engine: Engine, model_dir: Path, seqs, pooling: str) -> None:
    ours = engine.embed(*pack(seqs))
    ref = reference(model_dir, seqs, pooling)
    cos = cosines(ours, ref)
    print(f"{model_dir.name}: min cosine {cos.min():.6f} over {len(seqs)} sequences")
    assert cos.min() >= 0.999, cos


def test_bert_base_shape_in_bf16_matches_transformers_for_every_sequence(bert_dir) -> None:
    engine = Engine.load(bert_dir, device="cuda")
    assert engine.dtype == torch.bfloat16 and engine.runner is not None
    _check_close(engine, bert_dir, random_seqs(LENGTHS, 1000, 30000, seed=1), "mean")


def test_qwen3_shape_causal_last_token_matches_transformers(qwen3_causal_dir) -> None:
    engine = Engine.load(qwen3_causal_dir, device="cuda")
    assert engine.card.causal and engine.card.pooling == "last"
    _check_close(engine, qwen3_causal_dir, random_seqs(LENGTHS, 0, 32000, seed=2), "last")


def test_qwen3_shape_bidirectional_mean_matches_transformers(tmp_path) -> None:
    path = qwen3_dir(tmp_path / "qwen3-bidi", causal=False, vocab_size=32000, seed=3)
    engine = Engine.load(path, device="cuda")
    assert not engine.card.causal and engine.card.pooling == "mean"
    seqs = random_seqs(LENGTHS, 0, 32000, seed=4)
    ours = engine.embed(*pack(seqs))
    # Qwen3Model uses a mask mapping as given: zeros let every token see every other one.
    model = transformers.AutoModel.from_pretrained(path, torch_dtype=torch.float32)
    model = model.cuda().eval()
    ref = []
    with torch.inference_mode():
        for s in seqs:
            ids = torch.as_tensor(s, dtype=torch.long, device="cuda")[None]
            mask = {"full_attention": torch.zeros(1, 1, len(s), len(s), device="cuda")}
            ref.append(model(input_ids=ids, attention_mask=mask).last_hidden_state[0].mean(0))
    cos = cosines(ours, torch.stack(ref).float())
    print(f"qwen3 bidirectional: min cosine {cos.min():.6f}")
    assert cos.min() >= 0.999, cos


def test_real_minilm_with_head_dim_32_matches_transformers() -> None:
    engine = Engine.load(MINILM_DIR, device="cuda")
    assert engine.runner is not None and engine.runner.heads == (12, 12, 32)
    seqs = [
        np.concatenate([[101], s, [102]])
        for s in random_seqs([n - 2 for n in LENGTHS if n > 2], 1000, 29000, seed=5)
    ]
    _check_close(engine, MINILM_DIR, seqs, "mean")


def test_graph_replay_equals_eager_output(bert_dir) -> None:
    graphed = Engine.load(bert_dir, device="cuda")
    eager = Engine.load(bert_dir, device="cuda", graphs=False)
    graphed.warmup([1024])
    assert 1024 in graphed.runner.graphs
    for seed, lengths in enumerate([[5, 300, 17, 400], [1, 2, 3, 500], [450, 450]]):
        batch = pack(random_seqs(lengths, 1000, 30000, seed=10 + seed))
        ours, ref = graphed.embed(*batch), eager.embed(*batch)
        assert cosines(ours, ref).min() >= 0.9999
        torch.testing.assert_close(ours, ref, rtol=2e-2, atol=2e-2)


def test_a_bucket_is_captured_lazily_after_an_eager_batch(bert_dir) -> None:
    engine = Engine.load(bert_dir, device="cuda")
    batch = pack(random_seqs([20, 30], 1000, 30000, seed=20))
    first = engine.embed(*batch)
    assert 64 in engine.runner.graphs
    second = engine.embed(*batch)
    assert cosines(first, second).min() >= 0.9999


def test_a_one_token_batch_and_a_full_budget_batch_both_work(bert_dir) -> None:
    engine = Engine.load(bert_dir, device="cuda", max_batch_tokens=16384)
    one = engine.embed(np.array([2000], dtype=np.int32), np.array([0, 1], dtype=np.int32))
    ref_one = reference(bert_dir, [np.array([2000])], "mean")
    assert cosines(one, ref_one).min() >= 0.999
    seqs = random_seqs([512] * 32, 1000, 30000, seed=30)
    full = engine.embed(*pack(seqs))
    assert full.shape == (32, 768) and torch.isfinite(full).all()
    halves = torch.cat([engine.embed(*pack(seqs[:16])), engine.embed(*pack(seqs[16:]))])
    assert cosines(full, halves).min() >= 0.9999


def test_warmup_captures_do_not_spend_the_lazy_capture_budget(bert_dir, monkeypatch) -> None:
    import mesh.worker.engine.gpu as gpu

    engine = Engine.load(bert_dir, device="cuda")
    monkeypatch.setattr(gpu, "CAPTURE_BUDGET_S", 0.001)  # far less than any capture costs
    engine.warmup([16, 64])
    engine.embed(*pack(random_seqs([100, 100], 1000, 30000, seed=40)))  # the 256 bucket
    assert 256 in engine.runner.graphs  # the warm-up did not use the window up
    engine.embed(*pack(random_seqs([300, 300], 1000, 30000, seed=41)))  # 640: over budget
    assert 640 not in engine.runner.graphs

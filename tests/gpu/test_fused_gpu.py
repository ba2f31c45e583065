"""The fused CUDA path (Triton kernels, cuBLASLt GELU epilogue) on the GPU: each kernel
against its pure-torch reference on a 16k-row bf16 batch, and BERT-base / Qwen3-0.6B /
nomic-embed-text-v1.5 (and the same as GTE) shaped engines with ``kernels="fused"`` against
transformers in fp32, eagerly and through a graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_families_gpu import needs_gte_model
from test_gpu_engine import LENGTHS, cosines, pack, random_seqs, reference

from bench.shapes import bert_base_dir, qwen3_dir, rotary_post_ln_dir
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.kernels import fused
from mesh.worker.engine.models import blocks

pytest.importorskip("triton", reason="the fused kernels need triton")

ROWS = 16384
BF16 = torch.bfloat16


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen, device="cuda")).to(BF16)


def _gain(n: int, seed: int) -> torch.Tensor:
    return (1.0 + 0.2 * _randn(n, seed=seed).float()).to(BF16)


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    # Compiled kernels round to nearest like torch, so beyond summation order they differ
    # from the reference by a bf16 rounding here and there: at most ~1.5 ulps an element
    # (q/k rounds three times), and far less on the whole tensor.
    assert out.shape == ref.shape and out.dtype == ref.dtype
    out, ref = out.float(), ref.float()
    scale = ref.abs().max().item()
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1.6e-2 * scale)
    assert ((out - ref).norm() / ref.norm()).item() < 4e-3


def test_add_layer_norm_on_a_16k_batch() -> None:
    x, y = _randn(ROWS, 768, seed=1), _randn(ROWS, 768, seed=2)
    w, b = _gain(768, 3), _randn(768, seed=4, scale=0.1)
    out = fused.add_layer_norm(x, y, w, b, 1e-12)
    _check(out, fused.add_layer_norm_ref(x, y, w, b, 1e-12))
    _check(out, F.layer_norm(x + y, (768,), w, b, 1e-12))


def test_add_rms_norm_on_a_16k_batch_rounds_the_residual_as_torch() -> None:
    x, y, w = _randn(ROWS, 1024, seed=5), _randn(ROWS, 1024, seed=6), _gain(1024, 7)
    residual, ref = fused.add_rms_norm_ref(x, y, w, 1e-6)
    stream = x.clone()
    h = fused.add_rms_norm(stream, y, w, 1e-6)
    assert torch.equal(stream, residual)  # fp32 sum rounded to nearest, as torch's bf16 add
    _check(h, ref)
    _check(fused.add_rms_norm(x, None, w, 1e-6), fused.add_rms_norm_ref(x, None, w, 1e-6)[1])


def _rope_tables(d: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    # As blocks.rope_cos_sin builds them, for positions 0..511 over and over.
    positions = torch.arange(ROWS, device="cuda") % 512
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device="cuda").float() / d)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(BF16), emb.sin().to(BF16)


def test_qk_norm_rope_on_a_16k_batch_with_qwen3_heads() -> None:
    hq, hkv, d = 16, 8, 128
    qkv = _randn(ROWS, (hq + 2 * hkv) * d, seed=8, scale=2.0)
    q_norm, k_norm = _gain(d, 9), _gain(d, 10)
    cos, sin = _rope_tables(d, 1e6)
    args = (q_norm, k_norm, cos, sin, hq, hkv, d, 1e-6)
    ref = fused.qk_norm_rope_ref(qkv, *args)
    q, k, v = fused.qk_norm_rope_(qkv, *args)
    _check(q, ref[0])
    _check(k, ref[1])
    assert torch.equal(v, ref[2])


def test_silu_mul_on_a_16k_batch() -> None:
    gate_up = _randn(ROWS, 2 * 3072, seed=11, scale=2.0)
    _check(fused.silu_mul(gate_up), fused.silu_mul_ref(gate_up))


def test_rope_without_norms_on_a_16k_batch_with_nomic_heads() -> None:
    h, d = 12, 64
    qkv = _randn(ROWS, 3 * h * d, seed=15, scale=2.0)
    cos, sin = _rope_tables(d, 1000.0)
    ref = fused.rope_ref(qkv, cos, sin, h, h, d)
    q, k, v = fused.rope_(qkv, cos, sin, h, h, d)
    _check(q, ref[0])
    _check(k, ref[1])
    assert torch.equal(v, ref[2])


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_geglu_on_a_16k_batch(act: str) -> None:
    gate_up = _randn(ROWS, 2 * 3072, seed=16, scale=2.0)
    _check(fused.glu(gate_up, act), fused.glu_ref(gate_up, act))


def test_gelu_epilogue_is_the_tanh_gelu_of_the_up_projection() -> None:
    x, w, b = _randn(ROWS, 768, seed=12), _randn(3072, 768, seed=13, scale=0.05), _gain(3072, 14)
    out = blocks.up_gelu(x, w, b, exact=False)
    ref = F.gelu(F.linear(x.float(), w.float(), b.float()), approximate="tanh")
    assert out.dtype == BF16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return bert_base_dir(tmp_path_factory.mktemp("bert-base-fused"))


@pytest.fixture(scope="module")
def qwen3_causal_dir(tmp_path_factory) -> Path:
    return qwen3_dir(tmp_path_factory.mktemp("qwen3-fused"), causal=True, vocab_size=32000)


def _eager_then_graph(engine: Engine, seqs: list[np.ndarray]) -> tuple[torch.Tensor, ...]:
    # The first batch of a bucket runs eagerly and captures the bucket's graph after it;
    # the second replays that graph.
    ids, offsets = pack(seqs)
    eager = engine.embed(ids, offsets)
    bucket = engine.runner.bucket_for(int(offsets[-1]), len(seqs))
    assert bucket in engine.runner.graphs, f"capture failed: {engine.runner.failed}"
    return eager, engine.embed(ids, offsets)


def _check_eager_and_graph(engine: Engine, seqs: list, ref, label: str) -> None:  # noqa: ANN001
    """The engine's eager run and its graph replay both within cos 0.999 of ``ref``."""
    for name, ours in zip(("eager", "graph"), _eager_then_graph(engine, seqs), strict=True):
        cos = cosines(ours, ref)
        print(f"{label} {name}: min cosine {cos.min():.6f}")
        assert cos.min() >= 0.999, cos


@pytest.mark.parametrize("exact_gelu", [False, True])
def test_bert_base_shape_fused_matches_transformers_eager_and_in_a_graph(
    bert_dir: Path, exact_gelu: bool
) -> None:
    engine = Engine.load(bert_dir, device="cuda", kernels="fused", exact_gelu=exact_gelu)
    assert engine.kernels == "fused" and engine.dtype == BF16
    seqs = random_seqs(LENGTHS, 1000, 30000, seed=1)
    ref = reference(bert_dir, seqs, "mean")
    _check_eager_and_graph(engine, seqs, ref, f"bert-base fused (exact_gelu={exact_gelu})")


def test_qwen3_shape_fused_matches_transformers_eager_and_in_a_graph(qwen3_causal_dir) -> None:
    engine = Engine.load(qwen3_causal_dir, device="cuda")
    assert engine.kernels == "fused"  # the default on CUDA with triton
    seqs = random_seqs(LENGTHS, 0, 32000, seed=2)
    ref = reference(qwen3_causal_dir, seqs, "last")
    _check_eager_and_graph(engine, seqs, ref, "qwen3 fused")


@pytest.mark.parametrize("kind", ["NomicBert", "Gte"])
def test_nomic_shape_fused_matches_transformers_eager_and_in_a_graph(
    tmp_path: Path, kind: str
) -> None:
    # NomicBert: SwiGLU; Gte: GeGLU. Both are the "nomic" family.
    if kind == "Gte":
        needs_gte_model()
    path = rotary_post_ln_dir(tmp_path / kind, kind)
    engine = Engine.load(path, device="cuda")
    assert engine.card.family == "nomic"
    assert engine.kernels == "fused" and engine.dtype == BF16  # the default on CUDA
    seqs = random_seqs(LENGTHS, 1000, 30000, seed=3)
    ref = reference(path, seqs, "mean")
    _check_eager_and_graph(engine, seqs, ref, f"{kind} fused")

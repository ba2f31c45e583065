"""The fused CUDA path's Triton kernels, run in Triton's interpreter on CPU tensors, against
their pure-torch references and the plain functions they replace; and how Engine.load
picks the kernels.

The interpreter rounds fp32 -> bf16 by truncation where compiled Triton rounds to nearest
even, so bf16 results here may sit one bf16 ulp further from torch's than on a GPU;
tests/gpu/test_fused_gpu.py checks the compiled kernels in bf16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import cosines, pack, random_seqs, randomize, write_word_tokenizer

from mesh.worker.engine.engine import Engine, choose_kernels
from mesh.worker.engine.kernels import fused
from mesh.worker.engine.models import blocks

ROWS = [1, 7, 129]
HIDDEN = [48, 384, 768, 1024]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rtol, atol as a fraction of the reference's largest magnitude). fp32 sees summation order
# only, fp16 a rounding or two (measured up to 2.8e-4 of the scale). bf16 up to three
# truncations of 2 ** -7 each in the interpreter (measured 2.1e-2 for q/k norm + RoPE),
# where compiled kernels round to nearest: tests/gpu checks those more tightly.
TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (3e-2, 3e-2)}
# The plain eager functions round every intermediate to the activation dtype where the
# kernels round once, so half precision is compared against them more loosely (measured:
# fp16 9.4e-4, bf16 2.1e-2 of the scale).
PLAIN_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (3e-3, 3e-3), torch.bfloat16: (4e-2, 4e-2)}


def _close(out: torch.Tensor, ref: torch.Tensor, tol: dict = TOL) -> None:
    rtol, atol = tol[ref.dtype]
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol * scale)


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype)


def _gain(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (1.0 + 0.2 * _randn(n, dtype=torch.float32, seed=seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_add_layer_norm_matches_its_reference_and_the_eager_bert_residual(
    kernels, rows: int, hidden: int, dtype: torch.dtype
) -> None:
    x, y = _randn(rows, hidden, dtype=dtype, seed=1), _randn(rows, hidden, dtype=dtype, seed=2)
    w, b = _gain(hidden, dtype, 3), _randn(hidden, dtype=dtype, seed=4, scale=0.1)
    out = kernels.add_layer_norm(x, y, w, b, 1e-12)
    assert out.shape == x.shape and out.dtype == dtype
    _close(out, kernels.add_layer_norm_ref(x, y, w, b, 1e-12))
    # What blocks.post_ln computes for each residual.
    _close(out, F.layer_norm(x + y, (hidden,), w, b, 1e-12), PLAIN_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_updates_the_residual_in_place_and_normalizes_it(
    kernels, rows: int, hidden: int, dtype: torch.dtype
) -> None:
    x, y = _randn(rows, hidden, dtype=dtype, seed=5), _randn(rows, hidden, dtype=dtype, seed=6)
    w = _gain(hidden, dtype, 7)
    residual, ref = kernels.add_rms_norm_ref(x, y, w, 1e-6)
    plain = blocks.rms_norm(x + y, w, 1e-6)
    stream = x.clone()
    h = kernels.add_rms_norm(stream, y, w, 1e-6)
    _close(stream, residual)
    if dtype != torch.bfloat16:  # the interpreter truncates bf16; torch rounds
        assert torch.equal(stream, residual)
    _close(h, ref)
    _close(h, plain, PLAIN_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [48, 1024])
def test_add_rms_norm_without_a_residual_is_a_plain_rms_norm(
    kernels, hidden: int, dtype: torch.dtype
) -> None:
    x, w = _randn(7, hidden, dtype=dtype, seed=8), _gain(hidden, dtype, 9)
    before = x.clone()
    h = kernels.add_rms_norm(x, None, w, 1e-6)
    assert torch.equal(x, before)
    _close(h, kernels.add_rms_norm_ref(x, None, w, 1e-6)[1])
    _close(h, blocks.rms_norm(x, w, 1e-6), PLAIN_TOL)


def _rope_tables(rows: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # As DecoderEmbedder.forward builds them (blocks.rope_cos_sin), for positions 0..rows-1 of one sequence.
    inv_freq = 1.0 / 1000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = torch.arange(rows, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _plain_qk(qkv, q_norm, k_norm, cos, sin, hq, hkv, d):  # noqa: ANN001, ANN202
    # decoder.before_attention's math after the QKV projection.
    rows = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q = blocks.rms_norm(q.reshape(rows, hq, d), q_norm, 1e-6)
    k = blocks.rms_norm(k.reshape(rows, hkv, d), k_norm, 1e-6)
    cos, sin = cos[:, None], sin[:, None]
    q = q * cos + blocks.rotate_half(q) * sin
    k = k * cos + blocks.rotate_half(k) * sin
    return q, k, v.reshape(rows, hkv, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads", [(4, 2, 32), (4, 2, 64), (4, 2, 128), (16, 8, 128), (3, 3, 16)], ids=str
)
@pytest.mark.parametrize("rows", ROWS)
def test_qk_norm_rope_works_in_place_per_head_as_qwen3(
    kernels, rows: int, heads: tuple[int, int, int], dtype: torch.dtype
) -> None:
    hq, hkv, d = heads
    qkv = _randn(rows, (hq + 2 * hkv) * d, dtype=dtype, seed=10, scale=2.0)
    q_norm, k_norm = _gain(d, dtype, 11), _gain(d, dtype, 12)
    cos, sin = _rope_tables(rows, d, dtype)
    args = (q_norm, k_norm, cos, sin, hq, hkv, d, 1e-6)
    ref = kernels.qk_norm_rope_ref(qkv, *args)
    plain = _plain_qk(qkv, q_norm, k_norm, cos, sin, hq, hkv, d)
    original = qkv.clone()
    q, k, v = kernels.qk_norm_rope_(qkv, *args)
    assert (q.shape, k.shape, v.shape) == ((rows, hq, d), (rows, hkv, d), (rows, hkv, d))
    for view in (q, k, v):  # views into qkv, nothing copied
        assert view.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert torch.equal(v, original[:, (hq + hkv) * d :].view(rows, hkv, d))
    for got, want, eager in zip((q, k), ref[:2], plain[:2], strict=True):
        _close(got, want)
        _close(got, eager, PLAIN_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(12, 64), (4, 16), (3, 128)], ids=str)
@pytest.mark.parametrize("rows", ROWS)
def test_rope_without_norms_rotates_q_and_k_in_place_as_nomic(
    kernels, rows: int, heads: tuple[int, int], dtype: torch.dtype
) -> None:
    h, d = heads
    qkv = _randn(rows, 3 * h * d, dtype=dtype, seed=30, scale=2.0)
    cos, sin = _rope_tables(rows, d, dtype)
    ref = kernels.rope_ref(qkv, cos, sin, h, h, d)
    q_plain, k_plain, _ = blocks.split_qkv(qkv.clone(), (h, h, d))
    # What NomicBERT's eager layer computes.
    plain = [blocks.apply_rope(t, cos[:, None], sin[:, None]) for t in (q_plain, k_plain)]
    original = qkv.clone()
    q, k, v = kernels.rope_(qkv, cos, sin, h, h, d)
    assert (q.shape, k.shape, v.shape) == ((rows, h, d),) * 3
    assert q.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert torch.equal(v, original[:, 2 * h * d :].view(rows, h, d))
    for got, want, eager in zip((q, k), ref[:2], plain, strict=True):
        _close(got, want)
        _close(got, eager, PLAIN_TOL)


def test_strided_q_k_v_views_give_the_cpu_attention_the_same_result(kernels) -> None:
    from mesh.worker.engine.kernels.attention import cpu_backend

    hq, hkv, d, rows = 4, 2, 32, 40
    qkv = _randn(rows, (hq + 2 * hkv) * d, dtype=torch.float32, seed=13)
    q, k, v = fused._split_heads(qkv, hq, hkv, d)
    attn = cpu_backend()
    attn.plan(torch.tensor([0, 15, 40], dtype=torch.int32), causal=True)
    strided = attn.run(q, k, v)
    torch.testing.assert_close(strided, attn.run(q.contiguous(), k.contiguous(), v.contiguous()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [48, 1500, 3072])
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul_takes_gate_then_up_halves(
    kernels, rows: int, width: int, dtype: torch.dtype
) -> None:
    gate_up = _randn(rows, 2 * width, dtype=dtype, seed=14, scale=2.0)
    out = kernels.silu_mul(gate_up)
    assert out.shape == (rows, width)
    _close(out, kernels.silu_mul_ref(gate_up))
    gate, up = gate_up.chunk(2, dim=-1)
    _close(out, F.silu(gate) * up, PLAIN_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("width", [48, 1500, 3072])
def test_geglu_takes_gate_then_up_halves_with_erf_or_tanh_gelu(
    kernels, width: int, act: str, dtype: torch.dtype
) -> None:
    gate_up = _randn(7, 2 * width, dtype=dtype, seed=31, scale=2.0)
    out = kernels.glu(gate_up, act)
    assert out.shape == (7, width)
    _close(out, kernels.glu_ref(gate_up, act))
    # blocks.gated_mlp's act(first half) * second half, with the activation blocks names.
    fn = next(f for f, name in blocks.FUSED_GLU.items() if name == act)
    gate, up = gate_up.chunk(2, dim=-1)
    _close(out, fn(gate) * up, PLAIN_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layer_norm_takes_no_bias_and_a_broadcast_row(kernels, dtype: torch.dtype) -> None:
    x, w = _randn(9, 384, dtype=dtype, seed=32), _gain(384, dtype, 33)
    row = _randn(384, dtype=dtype, seed=34)
    out = kernels.add_layer_norm(x, row.expand_as(x), w, None, 1e-12)
    _close(out, kernels.add_layer_norm_ref(x, row.expand_as(x), w, None, 1e-12))
    _close(out, F.layer_norm(x + row, (384,), w, None, 1e-12), PLAIN_TOL)


def test_the_gelu_epilogue_switch_stays_exact_on_cpu() -> None:
    x = _randn(9, 48, dtype=torch.float32, seed=15)
    w, b = _randn(96, 48, dtype=torch.float32, seed=16), _randn(96, dtype=torch.float32, seed=17)
    exact = F.gelu(F.linear(x, w, b))
    assert torch.equal(blocks.up_gelu(x, w, b, exact=False), exact)
    assert torch.equal(blocks.up_gelu(x, w, b, exact=True), exact)


def test_tanh_gelu_is_within_the_documented_error_of_erf_gelu() -> None:
    # blocks.up_gelu's docstring: at most 4.7e-4, at |x| = 2.70.
    grid = torch.linspace(-10, 10, 2_000_001, dtype=torch.float64)
    err = (F.gelu(grid, approximate="tanh") - F.gelu(grid)).abs()
    worst = err.argmax()
    assert 4.6e-4 < err.max().item() < 4.75e-4
    assert abs(abs(grid[worst].item()) - 2.70) < 0.01
    # A bf16 ulp there is 2 ** -6: the approximation is far below output rounding.
    assert err.max().item() < 2**-6 / 30


def _qwen3_dir(path: Path, kind: str = "Qwen3") -> Path:
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1000.0,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}Model")(config).eval()
    randomize(model, seed=21)
    model.save_pretrained(path, safe_serialization=True)
    write_word_tokenizer(path, 300)
    return path


def _bert_dir(path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=300,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    randomize(model, seed=22)
    model.save_pretrained(path, safe_serialization=True)
    write_word_tokenizer(path, 300)
    return path


LENGTHS = [1, 9, 64, 3, 130, 17]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen3", "bert", "qwen2"])
def test_whole_model_through_the_fused_path_matches_the_plain_path(
    kernels, tmp_path: Path, monkeypatch, family: str, dtype: torch.dtype
) -> None:
    # Qwen2 (no q/k norm): the fused norms and SwiGLU with RoPE in torch.
    if family == "bert":
        path = _bert_dir(tmp_path / family)
    else:
        path = _qwen3_dir(tmp_path / family, "Qwen3" if family == "qwen3" else "Qwen2")
    seqs = random_seqs(300, LENGTHS, seed=23)
    plain = Engine.load(path, dtype=dtype).embed(*pack(seqs))
    engine = Engine.load(path, dtype=dtype)
    assert engine.kernels == "torch"
    engine.model.use_kernels("fused")  # Engine.load refuses "fused" on CPU; the model can
    norm = "add_layer_norm" if family == "bert" else "add_rms_norm"
    calls = []
    real = getattr(kernels, norm)

    def counted(*args):  # noqa: ANN002, ANN202
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(kernels, norm, counted)
    ours = engine.embed(*pack(seqs))
    layers = len(engine.model.layers)
    # Qwen3: the first input norm, then two per layer (post-attention, next/final norm).
    assert len(calls) == (2 * layers if family == "bert" else 2 * layers + 1)
    floor = 0.9999 if dtype == torch.float32 else 0.999
    assert cosines(ours, plain).min() >= floor
    if dtype == torch.float32:
        torch.testing.assert_close(ours, plain, rtol=1e-4, atol=1e-4)


def test_cpu_engines_run_plain_torch_and_refuse_fused(tmp_path: Path) -> None:
    path = _qwen3_dir(tmp_path / "q")
    assert Engine.load(path).kernels == "torch"
    assert Engine.load(path, compile_elementwise=True).kernels == "torch"
    with pytest.raises(ValueError, match="needs CUDA"):
        Engine.load(path, kernels="fused")


def test_kernel_choice_on_cuda_prefers_fused_and_keeps_the_old_flag(monkeypatch) -> None:
    cuda = torch.device("cuda")  # choose_kernels only reads the device type
    monkeypatch.setattr(fused, "available", lambda: True)
    assert choose_kernels(None, None, "bert", cuda) == "fused"
    assert choose_kernels(None, False, "qwen3", cuda) == "torch"  # --no-compile
    assert choose_kernels(None, True, "bert", cuda) == "compile"
    assert choose_kernels("torch", False, "bert", cuda) == "torch"
    with pytest.raises(ValueError, match="contradicts"):
        choose_kernels("fused", True, "bert", cuda)
    with pytest.raises(ValueError, match="one of"):
        choose_kernels("triton", None, "bert", cuda)
    monkeypatch.setattr(fused, "available", lambda: False)
    assert choose_kernels(None, None, "qwen3", cuda) == "compile"
    assert choose_kernels(None, None, "bert", cuda) == "torch"
    with pytest.raises(ValueError, match="needs triton"):
        choose_kernels("fused", None, "qwen3", cuda)

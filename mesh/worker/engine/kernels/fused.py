"""Hand-written Triton kernels for the non-GEMM parts of the CUDA forward.

Why: the H200 profile of one 16k-token batch spent
28 % of BERT-base's time and 42 % of Qwen3-0.6B's in elementwise kernels (eager LayerNorm,
GELU and residual adds; Inductor's dynamic-shape RMSNorm, RoPE and SiLU kernels, which
reached a fraction of the bandwidth). Each kernel here reads and writes every element once:

- :func:`add_layer_norm`: ``LayerNorm(x + y)``, the post-LN residual of BERT, NomicBERT
  and GTE;
- :func:`add_rms_norm`: ``x += y`` in place, then RMSNorm of the new ``x`` (Qwen3's residual
  fused with the next pre-norm), or a plain RMSNorm when ``y`` is None;
- :func:`qk_norm_rope_`: Qwen3's per-head q/k RMSNorm and rotary embedding, in place on the
  fused QKV projection output;
- :func:`rope_`: the same rotary embedding without the norms (NomicBERT, GTE);
- :func:`silu_mul`: SwiGLU's ``silu(gate) * up``; :func:`glu` the same with erf or tanh
  GELU (GeGLU: GTE).

Every kernel computes in fp32 and follows the rounding of the eager path where that path
rounds (the residual sum, HF's RMSNorm casting before the weight); each has a pure-torch
``*_ref`` of the same math, which the tests compare against. One program per row (per token
for q/k, per 1024 columns of a row for the GLUs), blocks a power of two at least the row,
row offsets in int64 (16384 x 6144 elements fit int32, but a 32k-token batch of a wider
model would not). No host syncs and no data-dependent shapes: capturable in CUDA graphs.

Triton is imported guarded: CPU installs import this module without it and never call the
kernels (:func:`available` says whether they can run). Tests run the kernels on CPU tensors
in Triton's interpreter (the ``kernels`` fixture of tests/unit/engine/conftest.py:
``TRITON_INTERPRET=1`` is read when ``triton.jit`` decorates, so it re-decorates them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the fused path is unavailable, nothing else is
    triton = None


def available() -> bool:
    """Whether the Triton kernels can be launched (triton imports)."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _add_layer_norm_kernel(
        X,
        Y,
        W,
        B,
        OUT,
        x_stride,
        y_stride,
        out_stride,
        n,
        eps,
        HAS_B: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(X + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + row * y_stride + cols, mask=mask, other=0.0).to(tl.float32)
        # Rounded to the activation dtype first, as eager F.layer_norm(x + y) sees the sum.
        s = (x + y).to(OUT.dtype.element_ty).to(tl.float32)
        mean = tl.sum(s, axis=0) / n
        diff = tl.where(mask, s - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(diff * diff, axis=0) / n + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        out = diff * rstd * w
        if HAS_B:
            out += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + row * out_stride + cols, out.to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def _add_rms_norm_kernel(
        X,
        Y,
        W,
        OUT,
        x_stride,
        y_stride,
        out_stride,
        n,
        eps,
        HAS_Y: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        dt = X.dtype.element_ty
        x = tl.load(X + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.load(Y + row * y_stride + cols, mask=mask, other=0.0).to(tl.float32)
            # The residual stream is stored in the activation dtype (as HF's
            # `residual + hidden_states`), and the norm reads that rounded value.
            x = (x + y).to(dt).to(tl.float32)
            tl.store(X + row * x_stride + cols, x.to(dt), mask=mask)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        # HF Qwen3RMSNorm: normalized value cast to the activation dtype, then the weight.
        normed = (x * rstd).to(dt).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + row * out_stride + cols, (normed * w).to(dt), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(
        QKV,
        QW,
        KW,
        COS,
        SIN,
        qkv_stride,
        cos_stride,
        sin_stride,
        hq,
        heads,
        eps,
        HAS_NORM: tl.constexpr,
        HALF: tl.constexpr,
        HEADS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One program per token: all its q and k heads as a [HEADS, BLOCK] tile of each
        # half of the head dim, so cos/sin and the norm weights are read once per token.
        tok = tl.program_id(0).to(tl.int64)
        h = tl.arange(0, HEADS)
        c = tl.arange(0, BLOCK)
        cmask = c < HALF
        mask = (h[:, None] < heads) & cmask[None, :]
        dt = QKV.dtype.element_ty
        # q heads then k heads lie back to back at the start of the row: head i at i * d.
        lo_ptr = QKV + tok * qkv_stride + h[:, None] * (2 * HALF) + c[None, :]
        hi_ptr = lo_ptr + HALF
        x_lo = tl.load(lo_ptr, mask=mask, other=0.0).to(tl.float32)
        x_hi = tl.load(hi_ptr, mask=mask, other=0.0).to(tl.float32)
        if HAS_NORM:
            ss = tl.sum(x_lo * x_lo, axis=1) + tl.sum(x_hi * x_hi, axis=1)
            rstd = tl.rsqrt(ss / (2 * HALF) + eps)[:, None]
            is_q = (h < hq)[:, None]
            wq_lo = tl.load(QW + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
            wq_hi = tl.load(QW + HALF + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
            wk_lo = tl.load(KW + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
            wk_hi = tl.load(KW + HALF + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
            # HF order: normalize, round, times the weight, round; RoPE then in fp32 from
            # that value, rounded once (HF rounds each product in bf16: we are closer to
            # exact).
            x_lo = ((x_lo * rstd).to(dt).to(tl.float32) * tl.where(is_q, wq_lo, wk_lo)).to(dt)
            x_hi = ((x_hi * rstd).to(dt).to(tl.float32) * tl.where(is_q, wq_hi, wk_hi)).to(dt)
            x_lo = x_lo.to(tl.float32)
            x_hi = x_hi.to(tl.float32)
        cos_row = COS + tok * cos_stride
        sin_row = SIN + tok * sin_stride
        cos_lo = tl.load(cos_row + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        cos_hi = tl.load(cos_row + HALF + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        sin_lo = tl.load(sin_row + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        sin_hi = tl.load(sin_row + HALF + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        # x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x_hi, x_lo)
        tl.store(lo_ptr, (x_lo * cos_lo - x_hi * sin_lo).to(dt), mask=mask)
        tl.store(hi_ptr, (x_hi * cos_hi + x_lo * sin_hi).to(dt), mask=mask)

    @triton.jit
    def _glu_kernel(GU, OUT, gu_stride, out_stride, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n
        g = tl.load(GU + row * gu_stride + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(GU + row * gu_stride + n + cols, mask=mask, other=0.0).to(tl.float32)
        if ACT == 0:  # silu
            a = g * tl.sigmoid(g)
        elif ACT == 1:  # erf GELU, torch's F.gelu
            a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
        else:  # tanh GELU: 0.5 g (1 + tanh(z)) = g sigmoid(2 z), z = sqrt(2 / pi) (g + c g^3)
            a = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g))
        tl.store(OUT + row * out_stride + cols, (a * u).to(OUT.dtype.element_ty), mask=mask)


# Columns a GLU program takes: rows of 3072 (Qwen3-0.6B) are 3 programs of 1024.
GLU_BLOCK = 1024


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _warps(elements: int) -> int:
    # 4-16 fp32 values a thread for one program's tile: enough in flight for these
    # memory-bound rows without spilling; 1..8 warps.
    return max(1, min(8, elements // 256))


def _check_rows(*tensors: torch.Tensor) -> None:
    # Shapes and strides only: no device sync, so this is fine inside graph capture.
    for t in tensors:
        if t.dim() != 2 or t.stride(-1) != 1:
            raise ValueError(f"expected [rows, n] with unit column stride, got {tuple(t.shape)}")


def add_layer_norm(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """``LayerNorm(x + y)`` over the last dim of ``[rows, n]`` (``bias`` None: none); a new
    tensor. ``y`` may broadcast one row (row stride 0)."""
    _check_rows(x, y)
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        block = _pow2(n)
        _add_layer_norm_kernel[(rows,)](
            x,
            y,
            weight,
            weight if bias is None else bias,  # never read without HAS_B
            out,
            x.stride(0),
            y.stride(0),
            out.stride(0),
            n,
            eps,
            HAS_B=bias is not None,
            BLOCK=block,
            num_warps=_warps(block),
        )
    return out


def add_layer_norm_ref(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    s = (x + y).float()
    b = None if bias is None else bias.float()
    return F.layer_norm(s, s.shape[-1:], weight.float(), b, eps).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """``x += y`` in place (the residual stream), then HF RMSNorm of ``x``; a new tensor.

    ``y`` None: RMSNorm of ``x`` alone, ``x`` untouched.
    """
    _check_rows(x)
    if y is not None:
        _check_rows(y)
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        block = _pow2(n)
        other = x if y is None else y
        _add_rms_norm_kernel[(rows,)](
            x,
            other,
            weight,
            out,
            x.stride(0),
            other.stride(0),
            out.stride(0),
            n,
            eps,
            HAS_Y=y is not None,
            BLOCK=block,
            num_warps=_warps(block),
        )
    return out


def add_rms_norm_ref(
    x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the new residual ``x + y``, its RMSNorm); ``x`` is not modified."""
    s = x if y is None else x + y
    return s, _rms_norm_ref(s, weight, eps)


def _rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed


def _split_heads(
    qkv: torch.Tensor, hq: int, hkv: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(rows, hq, d), k.view(rows, hkv, d), v.view(rows, hkv, d)


def qk_norm_rope_(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hq: int,
    hkv: int,
    d: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm then rotary embedding of q and k, in place in ``qkv``.

    ``qkv``: ``[T, (hq + 2 * hkv) * d]``, the fused projection's output; ``cos``, ``sin``:
    ``[T, d]`` (any row stride). Returns views ``q [T, hq, d]``, ``k, v [T, hkv, d]`` into
    ``qkv`` (strided: FlashInfer and the CPU SDPA backend take strides).
    """
    return _rope_(qkv, (q_norm, k_norm, eps), cos, sin, hq, hkv, d)


def rope_(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`qk_norm_rope_` without the norms (NomicBERT, GTE): rotary embedding of q and
    k in place in ``qkv``, in one pass instead of rotate_half's cat, products and sum."""
    return _rope_(qkv, None, cos, sin, hq, hkv, d)


def _rope_(
    qkv: torch.Tensor,
    norms: tuple[torch.Tensor, torch.Tensor, float] | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hq: int,
    hkv: int,
    d: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_rows(qkv, cos, sin)
    if d % 2 or qkv.shape[1] != (hq + 2 * hkv) * d:
        raise ValueError(f"qkv of width {qkv.shape[1]} is not ({hq} + 2 * {hkv}) * {d}")
    # Without norms the weight pointers are never read: any tensor will do.
    q_norm, k_norm, eps = norms if norms is not None else (qkv, qkv, 0.0)
    rows = qkv.shape[0]
    if rows:
        heads, block = _pow2(hq + hkv), _pow2(d // 2)
        _qk_norm_rope_kernel[(rows,)](
            qkv,
            q_norm,
            k_norm,
            cos,
            sin,
            qkv.stride(0),
            cos.stride(0),
            sin.stride(0),
            hq,
            hq + hkv,
            eps,
            HAS_NORM=norms is not None,
            HALF=d // 2,
            HEADS=heads,
            BLOCK=block,
            num_warps=_warps(heads * block),
        )
    return _split_heads(qkv, hq, hkv, d)


def _rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # In fp32 from x, rounded once; cos, sin [T, d].
    half = x.shape[-1] // 2
    xf, cos_f, sin_f = x.float(), cos.float()[:, None, :], sin.float()[:, None, :]
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos_f + rotated * sin_f).to(x.dtype)


def qk_norm_rope_ref(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hq: int,
    hkv: int,
    d: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New tensors (``qkv`` untouched) of the kernel's math: HF norm, then fp32 RoPE."""
    q, k, v = _split_heads(qkv, hq, hkv, d)
    q = _rope_ref(_rms_norm_ref(q, q_norm, eps), cos, sin)
    k = _rope_ref(_rms_norm_ref(k, k_norm, eps), cos, sin)
    return q, k, v.clone()


def rope_ref(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New tensors (``qkv`` untouched) of :func:`rope_`'s math: fp32 RoPE, rounded once."""
    q, k, v = _split_heads(qkv, hq, hkv, d)
    return _rope_ref(q, cos, sin), _rope_ref(k, cos, sin), v.clone()


# The activations _glu_kernel computes, by its ACT constant.
GLU_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``[T, 2F] -> [T, F]``: ``silu(gate) * up``, gate the first half of each row."""
    return glu(gate_up, "silu")


def glu(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    """``[T, 2F] -> [T, F]``: ``act(gate) * up``, gate the first half of each row; ``act``
    one of :data:`GLU_ACTS` (SwiGLU, GeGLU with erf or tanh GELU)."""
    _check_rows(gate_up)
    rows, width = gate_up.shape
    n = width // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = min(_pow2(n), GLU_BLOCK)
        grid = (rows, triton.cdiv(n, block))
        _glu_kernel[grid](
            gate_up,
            out,
            gate_up.stride(0),
            out.stride(0),
            n,
            ACT=GLU_ACTS[act],
            BLOCK=block,
            num_warps=_warps(block),
        )
    return out


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    return glu_ref(gate_up, "silu")


def glu_ref(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    fns = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}
    return (fns[act](gate) * up).to(gate_up.dtype)

"""``mesh-bench attention``: attention backends alone, on one GPU, at the families' shapes.

For each family shape (heads, head_dim, layers, which layers are windowed, a relative position
bias or not) and each backend that can run it, one packed batch of about ``--tokens`` tokens
(lengths drawn as ``mesh-bench gpu-engine``'s workload: 40 % of 8..32 tokens, 60 % of 64..512,
cut at the family's longest input) is planned and run through every layer of the family's
pattern, and timed:

- **eager**: ``plan`` plus one ``run`` per layer, CUDA events around the lot, the median of
  ``--repeats`` after ``--warmup`` runs;
- **graph**: where the backend takes a ``capacity`` (its planned instance replays inside a CUDA
  graph), the layers' runs captured once and replayed, ``plan`` timed apart.

Before timing, each backend's output of one local and one global layer is checked against
``SdpaPerSequence`` (one exact SDPA call per sequence) in the same dtype: the lowest cosine over
the rows is reported, and a backend under ``--min-cos`` is marked wrong and not timed. Every
backend runs in its own try block: one that fails (a kernel that does not build, a shape it
refuses) is reported with its error and the rest go on.

    mesh-bench attention --json OUT.json [--families mpnet,modernbert,...] [--backends ...]

Backends: ``varlen`` (torch's varlen attention), ``flashinfer`` (fa2 ragged prefill, no window),
``flashinfer-windowed`` (the window as a custom mask), ``sdpa-grouped`` (padded groups, a float
mask), and the candidates ``flex`` (``kernels.flex_attention``) and ``triton``
(``kernels.triton_attention``) where those modules exist.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from bench.harness.gpu_engine import workload
from mesh.worker.engine.kernels.attention import AttentionBackend, SdpaPerSequence


@dataclass(frozen=True)
class Shape:
    """A family's attention: ``layers`` of which those in ``windowed`` take ``window``."""

    name: str
    heads: tuple[int, int, int]  # query heads, key/value heads, head_dim
    layers: int
    max_len: int
    window: int | None = None
    windowed: tuple[int, ...] = ()
    bias: bool = False

    def layer_windows(self) -> list[int | None]:
        return [self.window if i in self.windowed else None for i in range(self.layers)]


SHAPES = {
    "minilm": Shape("minilm", (12, 12, 32), 6, 512),
    "bert-base": Shape("bert-base", (12, 12, 64), 12, 512),
    "mpnet-base": Shape("mpnet-base", (12, 12, 64), 12, 512, bias=True),
    # ModernBERT-base: 22 layers, every third global, a 128-token local window (64 each side).
    "modernbert-base": Shape(
        "modernbert-base", (12, 12, 64), 22, 8192, 64, tuple(i for i in range(22) if i % 3)
    ),
    # EmbeddingGemma-300m: 24 layers, five sliding (512: 256 each side) to one global.
    "embeddinggemma-300m": Shape(
        "embeddinggemma-300m", (3, 1, 256), 24, 2048, 256, tuple(i for i in range(24) if i % 6 != 5)
    ),
}


@dataclass
class Result:
    shape: str
    backend: str
    tokens: int
    sequences: int
    attention_gflop: float = 0.0  # QK^T and PV over every full l x l, all layers
    min_cos: float | None = None
    graph_min_cos: float | None = None
    eager_ms: float | None = None
    plan_ms: float | None = None
    graph_ms: float | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _lengths(tokens: int, max_len: int, seed: int) -> list[int]:
    out: list[int] = []
    for n in workload(max(64, tokens // 32), seed):
        n = min(int(n), max_len)
        if sum(out) + n > tokens:
            break
        out.append(n)
    return out


def _bias(shape: Shape, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """MPNet's bias as its model builds it, from a random bucket table: ``[Hq, L, L]``."""
    from mesh.worker.engine.models.mpnet import NUM_BUCKETS, position_bias

    table = torch.randn(NUM_BUCKETS, shape.heads[0], device=device, dtype=dtype)
    return position_bias(table, shape.max_len)


def _factories(
    shape: Shape, device: torch.device, dtype: torch.dtype
) -> dict[str, Callable[[tuple[int, int] | None], AttentionBackend]]:
    """Backend name -> a constructor taking ``capacity`` (None: eager)."""
    from mesh.worker.engine.kernels import flashinfer_attention as fa
    from mesh.worker.engine.kernels.attention_grouped import SdpaGrouped

    heads = shape.heads
    out: dict[str, Callable[[tuple[int, int] | None], AttentionBackend]] = {
        "varlen": lambda cap: fa.TorchVarlen(heads, device, shape.max_len, cap),
        "flashinfer": lambda cap: fa.FlashInferRagged(heads, dtype, device, cap),
        "sdpa-grouped": lambda cap: _eager_only(cap, SdpaGrouped),
    }
    if shape.window is not None:
        from mesh.worker.engine.kernels.flashinfer_windowed import FlashInferWindowed

        window = shape.window
        out["flashinfer-windowed"] = lambda cap: _eager_only(
            cap, lambda: FlashInferWindowed(heads, dtype, device, window)
        )
    try:
        from mesh.worker.engine.kernels import flex_attention
    except ImportError:
        pass
    else:
        windows = tuple(dict.fromkeys(shape.layer_windows()))
        out["flex"] = lambda cap: flex_attention.FlexAttention(device, windows, capacity=cap)
    try:
        from mesh.worker.engine.kernels import triton_attention
    except ImportError:
        pass
    else:
        out["triton"] = lambda cap: triton_attention.TritonVarlen(heads, device, capacity=cap)
    return out


def _eager_only(cap: tuple[int, int] | None, make: Callable[[], AttentionBackend]) -> Any:
    if cap is not None:
        raise NotImplementedError("eager only: no capacity")
    return make()


def _takes(backend: AttentionBackend, shape: Shape) -> str | None:
    """Why ``backend`` cannot run ``shape`` as the model would (None: it can)."""
    if shape.bias and not backend.takes_bias:
        return "takes no bias"
    if shape.window is not None and not backend.takes_window:
        return "takes no window"
    return None


def _layers(
    backend: AttentionBackend,
    shape: Shape,
    qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    bias: torch.Tensor | None,
) -> list[torch.Tensor]:
    outs = []
    for (q, k, v), window in zip(qkv, shape.layer_windows(), strict=True):
        kwargs: dict[str, Any] = {}
        if bias is not None:
            kwargs["bias"] = bias
        if window is not None:
            kwargs["window"] = window
        outs.append(backend.run(q, k, v, **kwargs))
    return outs


def _min_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    """The lowest cosine over rows; NaN when any row is NaN (a NaN never passes a check)."""
    a, b = a.float().flatten(1), b.float().flatten(1)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    return math.nan if bool(cos.isnan().any()) else float(cos.min())


def _check(outs: list[torch.Tensor], reference: list[torch.Tensor], probe: list[int]) -> float:
    """The lowest cosine of the ``probe`` layers' outputs against the reference's."""
    values = [_min_cos(outs[i][: reference[i].shape[0]], reference[i]) for i in probe]
    return math.nan if any(math.isnan(v) for v in values) else min(values)


def _time_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():  # --device cpu: a check that every step runs
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(
    shape: Shape, name: str, make: Callable[[tuple[int, int] | None], AttentionBackend],
    cu: torch.Tensor, qkv: list, bias: torch.Tensor | None, reference: list[torch.Tensor],
    args: argparse.Namespace,
) -> Result:  # fmt: skip
    """One backend on one shape: checked against the reference, then timed eager and in a
    graph where it can."""
    tokens, seqs = int(cu[-1]), len(cu) - 1
    lengths = (cu[1:] - cu[:-1]).double()
    hq, _, d = shape.heads
    gflop = float((lengths * lengths).sum()) * 4 * hq * d * shape.layers / 1e9
    result = Result(shape.name, name, tokens, seqs, gflop)
    try:
        backend = make(None)
        why = _takes(backend, shape)
        if why is not None:
            result.error = why
            return result
        backend.plan(cu, causal=False)
        outs = _layers(backend, shape, qkv, bias)
        result.min_cos = _check(outs, reference, _probe(shape))
        if not result.min_cos >= args.min_cos:  # NaN too
            result.error = f"wrong: min cos {result.min_cos:.5f} < {args.min_cos}"
            return result

        def eager() -> None:
            backend.plan(cu, causal=False)
            _layers(backend, shape, qkv, bias)

        result.eager_ms = _time_ms(eager, args.warmup, args.repeats)
    except Exception as exc:  # a candidate that fails is reported, the rest go on
        result.error = f"{type(exc).__name__}: {exc}"
        result.notes.append(traceback.format_exc(limit=4)[-1500:])
        return result
    if cu.device.type == "cpu" and not cu.is_pinned():
        result.notes.append("graph: not on a CPU")
        return result
    try:
        _graph(result, shape, make, cu, qkv, bias, reference, args)
    except NotImplementedError as exc:
        result.notes.append(f"graph: {exc}")
    except Exception as exc:
        result.notes.append(f"graph failed: {type(exc).__name__}: {exc}")
    return result


def _probe(shape: Shape) -> list[int]:
    """The layers checked: the first windowed one (if any) and the last."""
    return [*shape.windowed[:1], shape.layers - 1]


def _graph(
    result: Result, shape: Shape, make: Callable[[tuple[int, int] | None], AttentionBackend],
    cu: torch.Tensor, qkv: list, bias: torch.Tensor | None, reference: list[torch.Tensor],
    args: argparse.Namespace,
) -> None:  # fmt: skip
    """Capture the layers' runs once, replay, check the replay's outputs, then time."""
    seqs, rows = len(cu) - 1, int(cu[-1])
    backend = make((seqs + 8, rows))
    backend.plan(cu, causal=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _layers(backend, shape, qkv, bias)  # warm: compiles, lazy allocations
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _layers(backend, shape, qkv, bias)
    backend.plan(cu, causal=False)  # as a replay follows its batch's plan
    graph.replay()
    torch.cuda.synchronize()
    result.graph_min_cos = _check(outs, reference, _probe(shape))
    if not result.graph_min_cos >= args.min_cos:
        result.notes.append(f"graph wrong: min cos {result.graph_min_cos:.5f}; not timed")
        return
    result.plan_ms = _time_ms(lambda: backend.plan(cu, causal=False), args.warmup, args.repeats)
    result.graph_ms = _time_ms(graph.replay, args.warmup, args.repeats)


def run_shape(shape: Shape, backends: list[str] | None, args: argparse.Namespace) -> list[Result]:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = _lengths(args.tokens, shape.max_len, args.seed)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(np.cumsum(lengths), dtype=torch.int32)
    if device.type == "cuda":
        cu = cu.pin_memory()  # as the runner plans: host offsets, pinned
    hq, hkv, d = shape.heads
    total = int(cu[-1])
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def rand(h: int) -> torch.Tensor:
        return torch.randn(total, h, d, device=device, dtype=dtype, generator=gen)

    qkv = [(rand(hq), rand(hkv), rand(hkv)) for _ in range(shape.layers)]
    bias = _bias(shape, device, dtype) if shape.bias else None
    ref_backend = SdpaPerSequence()
    ref_backend.plan(cu, causal=False)
    reference = _layers(ref_backend, shape, qkv, bias)
    results = []
    for name, make in _factories(shape, device, dtype).items():
        if backends and name not in backends:
            continue
        started = time.perf_counter()
        result = measure(shape, name, make, cu, qkv, bias, reference, args)
        print(_row(result), f"({time.perf_counter() - started:.0f} s)", flush=True)
        results.append(result)
    return results


def _row(r: Result) -> str:
    def ms(x: float | None) -> str:
        return f"{x:9.2f}" if x is not None else "        -"

    cos = f"{r.min_cos:.5f}" if r.min_cos is not None else "      -"
    # From the eager time (plan and every layer), which every backend has.
    tflops = f"{r.attention_gflop / r.eager_ms:7.1f}" if r.eager_ms else "      -"
    tail = f"  {r.error}" if r.error else ""
    return (f"{r.shape:20} {r.backend:20} {r.tokens:6d} tok {r.sequences:4d} seq  cos {cos}  "
            f"eager {ms(r.eager_ms)} ms  plan {ms(r.plan_ms)}  graph {ms(r.graph_ms)} ms  "
            f"{tflops} dense TFLOP/s{tail}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mesh-bench attention", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument(
        "--families", default=",".join(SHAPES), help="comma list of: " + ", ".join(SHAPES)
    )
    parser.add_argument(
        "--backends", default="", help="comma list (default: every one that exists)"
    )
    parser.add_argument("--tokens", type=int, default=16384, help="tokens of the packed batch")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--min-cos", type=float, default=0.999)
    parser.add_argument("--seed", type=int, default=20261205)
    parser.add_argument(
        "--device",
        default="cuda",
        help="cpu: check that every step runs (fp32, no graphs; timings mean nothing)",
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "mesh-bench attention needs a CUDA device (--device cpu to check it)", file=sys.stderr
        )
        return 2
    backends = [b for b in args.backends.split(",") if b] or None
    results: list[Result] = []
    for name in args.families.split(","):
        if name not in SHAPES:
            parser.error(f"unknown family {name!r}: one of {', '.join(SHAPES)}")
        results += run_shape(SHAPES[name], backends, args)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    doc = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "tokens": args.tokens,
        "results": [_no_nan(asdict(r)) for r in results],
    }
    with open(args.json, "w") as f:
        json.dump(
            doc,
            f,
            indent=1,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else x,
        )
    return 0


def _no_nan(row: dict[str, Any]) -> dict[str, Any]:
    """NaN as null: the file stays strict JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


if __name__ == "__main__":
    raise SystemExit(main())

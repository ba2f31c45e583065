"""``--max-batch-tokens auto``: the worker measures its own throughput against batch tokens.

After the model loads, :func:`measure_curve` runs a short sweep of synthetic packed batches
(deterministic lengths of real texts' sizes, random ids) through the engine at each candidate
budget, smallest first, and :func:`choose_budget` takes the smallest budget within
``tolerance`` of the best rate seen: past that knee a bigger batch buys no throughput, only a
longer wait for whatever queues behind it. The worker advertises the choice in READY with the
rate it measured there (``WorkerReady.tokens_per_s``, the broker's first estimate of its
speed before any batch came back) and logs the curve, one line a point.

The sweep stays cheap: each point runs ``repeats`` times, the fastest counted, after a warm-up
run (on a CPU before the first point only; on CUDA at each point, its graph captured first,
outside the lazy capture budget). Past the first ``MIN_POINTS`` (two, once the sweep has run
``MAX_SWEEP_S``), a point whose batch would take longer than ``max_point_s`` (at the best rate
so far) is not run; on CUDA a point that runs out of memory ends the sweep (the budget is
capped by memory there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from mesh.worker.engine.engine import GRAPH_MAX_TOKENS, Engine, default_max_batch_tokens
from mesh.worker.engine.runner import EngineEntry

log = logging.getLogger("embedmesh.worker")

# The smallest budget within this fraction of the best rate is chosen; 0.02..0.1 is reasonable
# (run-to-run noise on a shared host is a few percent).
TOLERANCE = 0.05
# Candidates: powers of two over these ranges, cut at the graph buckets on CUDA.
CPU_RANGE = (256, 16384)
GPU_RANGE = (1024, 65536)
# A point whose one batch would run longer than this (at the best rate so far) is not run:
# on 2 CPU cores MiniLM's 2k batch takes ~0.25 s, the 4k one is not run, the sweep takes ~2 s.
MAX_POINT_S = 0.4
REPEATS = 2  # timed runs per point after its warm-up run; the fastest counts
# The first this many points are run whatever their time: one slow point (a busy host, a
# large model) must not leave the curve a single point, the smallest budget.
MIN_POINTS = 3
# ... unless the sweep has run this long (a busy host): then two points are enough.
MAX_SWEEP_S = 4.0
# Synthetic sequence lengths: uniform over this range (cut at the model's longest input), the
# size of passages and queries in a corpus (the repository's averages ~120 tokens).
SEQ_LENGTHS = (16, 256)
SEED = 0


def budget_is_auto(value: int | str | None, device: str) -> bool:
    """Whether ``--max-batch-tokens`` ``value`` asks for the sweep on ``device``: "auto", or
    nothing given on a CPU (the default there; a GPU's is its largest graph bucket)."""
    return value == "auto" or (value is None and not device.startswith("cuda"))


@dataclass(frozen=True)
class CurvePoint:
    tokens: int  # the budget: tokens in one batch
    tokens_per_s: float  # the best of the timed runs
    seconds: float  # one batch's time at that rate


def choose_budget(curve: list[CurvePoint], tolerance: float = TOLERANCE) -> CurvePoint:
    """The point of the smallest budget whose rate is within ``tolerance`` of the best."""
    if not curve:
        raise ValueError("an empty curve has no knee")
    best = max(p.tokens_per_s for p in curve)
    return min(
        (p for p in curve if p.tokens_per_s >= (1 - tolerance) * best), key=lambda p: p.tokens
    )


def candidates(device_type: str, min_tokens: int, max_tokens: int | None = None) -> list[int]:
    """Budgets to try on ``device_type``: powers of two over its range, none below
    ``min_tokens`` (the model's longest input must fit one batch: the first candidate is that
    many tokens when it is over the range's start and not a power of two) and none above
    ``max_tokens`` (the largest CUDA graph bucket: a batch over it runs eagerly)."""
    low, high = GPU_RANGE if device_type == "cuda" else CPU_RANGE
    if max_tokens is not None:
        high = min(high, max_tokens)
    floor = max(min_tokens, min(low, high), 1)
    sizes = [1 << k for k in range(low.bit_length() - 1, high.bit_length())]
    return [floor, *(s for s in sizes if floor < s <= high)]


def synthetic_batch(tokens: int, max_len: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``int32`` ids and offsets of exactly ``tokens`` tokens in sequences of realistic,
    deterministic lengths (the same batch every time for the same arguments)."""
    rng = np.random.default_rng(SEED)
    low, high = min(SEQ_LENGTHS[0], max_len), max(1, min(SEQ_LENGTHS[1], max_len))
    lengths: list[int] = []
    left = tokens
    while left > 0:
        n = min(left, int(rng.integers(low, high + 1)))
        lengths.append(n)
        left -= n
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(min(1000, vocab - 1), vocab, size=tokens, dtype=np.int32)
    return ids, offsets


def measure_curve(
    engine: Engine,
    sizes: list[int],
    max_point_s: float = MAX_POINT_S,
    repeats: int = REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    min_points: int = MIN_POINTS,
    max_sweep_s: float = MAX_SWEEP_S,
) -> list[CurvePoint]:
    """Throughput of ``engine`` at each of ``sizes`` (ascending), within the time and memory
    caps in the module docstring; the first ``min_points`` sizes whatever their time (two
    once ``max_sweep_s`` passed)."""
    curve: list[CurvePoint] = []
    best = 0.0
    started = clock()
    for tokens in sizes:
        enough = min_points if clock() - started < max_sweep_s else min(2, min_points)
        if len(curve) >= enough and tokens / best > max_point_s:
            log.info("max batch tokens auto: %d tokens not tried (over %.1f s a batch at "
                     "%.0f tokens/s)", tokens, max_point_s, best)  # fmt: skip
            break
        # On a CPU one warm-up serves the sweep (the best of the timed runs absorbs a new
        # size's first allocations); on CUDA each size has its own graph to capture and replay.
        warm = not curve or engine.device.type == "cuda"
        try:
            seconds = time_batch(engine, tokens, engine.card.max_input_tokens, repeats, warm, clock)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            log.info("max batch tokens auto: %d tokens ran out of device memory", tokens)
            break
        point = CurvePoint(tokens, tokens / seconds, seconds)
        best = max(best, point.tokens_per_s)
        curve.append(point)
        log.info("max batch tokens auto: %6d tokens %10.0f tokens/s %8.1f ms a batch",
                 tokens, point.tokens_per_s, seconds * 1000)  # fmt: skip
    return curve


def time_batch(
    engine: EngineEntry,
    tokens: int,
    max_len: int,
    repeats: int,
    warm: bool,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The fastest of ``repeats`` runs of one synthetic batch of ``tokens`` in sequences of at
    most ``max_len`` tokens, after a warm-up run when ``warm``."""
    ids, offsets = synthetic_batch(tokens, max_len, engine.vocab_size)
    cuda = engine.device.type == "cuda"
    engine.warmup([tokens])  # CUDA: its bucket's graph now, so the timed runs replay it
    fastest = float("inf")
    for run in range(repeats + warm):
        if cuda:
            torch.cuda.synchronize(engine.device)  # nothing earlier in the timed span
        started = clock()
        engine.embed(ids, offsets)
        if cuda:
            torch.cuda.synchronize(engine.device)  # the forward has run, not just launched
        if run or not warm:  # a warm-up run: allocations, a lazy capture, caches
            fastest = min(fastest, clock() - started)
    return max(fastest, 1e-9)


def auto_budget(engine: Engine) -> CurvePoint:
    """Sweep ``engine`` and return the chosen point (logged with the curve).

    The candidates start at the model's longest input, or at the default budget where that is
    shorter (so that auto never refuses an input the default takes), and stop at the largest
    graph bucket on CUDA, as the default does. With one candidate there is nothing to choose:
    its rate is left for the broker to learn (0)."""
    started = time.perf_counter()
    runner = engine.gpu_runner
    largest = runner.buckets[-1] if runner is not None and runner.buckets else None
    default = default_max_batch_tokens(engine.device.type, largest or GRAPH_MAX_TOKENS)
    floor = min(engine.card.max_input_tokens, default)
    sizes = candidates(engine.device.type, floor, largest)
    curve = measure_curve(engine, sizes) if len(sizes) > 1 else []
    if not curve:  # one candidate, or the first ran out of memory
        log.info("max batch tokens auto: %d tokens, nothing measured (candidates %s)",
                 sizes[0], sizes)  # fmt: skip
        return CurvePoint(sizes[0], 0.0, 0.0)
    chosen = choose_budget(curve)
    log.info("max batch tokens auto: chose %d tokens (%.0f tokens/s, %.1f ms a batch; the "
             "smallest within %.0f%% of the best) after a %.1f s sweep", chosen.tokens,
             chosen.tokens_per_s, chosen.seconds * 1000, TOLERANCE * 100,
             time.perf_counter() - started)  # fmt: skip
    return chosen

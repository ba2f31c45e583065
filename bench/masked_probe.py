"""Why MPNet is slow through HTTP: its masked batches timed on seen and unseen shapes, per
SDPA backend (issue 13's one miss; docs/gpu.md, "Issue 13's families and outputs").

On the H200 MPNet-base ran 0.235 M tok/s alone (`bench/families.py`, which repeats 20 FCFS
batches) but 0.044 through HTTP, where every batch is new; its first pass over the 20
batches ran at 0.096. Its attention is torch SDPA over length-sorted padded groups with a
float mask (`attention_grouped.SdpaGrouped`), so each batch brings new group shapes. This
separates the suspects in one short device call:

- ``repeat``: the same batches again and again (what the families bench measures);
- ``fresh``: every batch once, each a new draw of corpus texts (what HTTP traffic is);
- each under the SDPA kernels grouped SDPA may be given (``SdpaGrouped.backends``): its
  default, all but cuDNN (``attention_grouped.NO_CUDNN``); torch's own order, which on sm90
  with a recent cuDNN puts cuDNN first; efficient, cuDNN or math alone (one that refuses the
  inputs is recorded, not fatal);
- per run: groups per batch, the caching allocator's device allocations (``num_device_alloc``:
  a cudaMalloc each) and the host time of ``plan``.

    python3 bench/masked_probe.py --out OUT [--family mpnet] [--batches 12]
    python3 bench/masked_probe.py --quick      # tiny shapes on CPU: the script runs

Prints one line per run and writes OUT/masked-probe.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention import SDPBackend

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import DEFAULT_CORPUS, load_texts  # noqa: E402
from bench.families import BUDGET, tokenize  # noqa: E402
from bench.family_models import FAMILIES, build  # noqa: E402
from bench.gpu_engine import fcfs_batches  # noqa: E402
from mesh.worker.engine.engine import Engine  # noqa: E402
from mesh.worker.engine.kernels.attention_grouped import NO_CUDNN  # noqa: E402

BACKENDS: dict[str, tuple[SDPBackend, ...] | None] = {
    "no-cudnn": NO_CUDNN,  # SdpaGrouped's default
    "torch-order": None,
    "efficient": (SDPBackend.EFFICIENT_ATTENTION,),
    "cudnn": (SDPBackend.CUDNN_ATTENTION,),
    "math": (SDPBackend.MATH,),
}


@contextlib.contextmanager
def sdpa_backends(attn: object, backends: tuple[SDPBackend, ...] | None) -> Iterator[None]:
    """``attn`` (the runner's SdpaGrouped; None on CPU) given ``backends`` for a while."""
    if attn is None:
        yield
        return
    before = attn.backends
    attn.backends = backends
    try:
        yield
    finally:
        attn.backends = before


def draws(ids: list[np.ndarray], count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` FCFS batches, each from its own shuffle of the texts: new group shapes."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        order = rng.permutation(len(ids))
        out.extend(fcfs_batches([ids[i] for i in order], BUDGET)[: count - len(out)])
    return out


def device_allocs(device: str) -> int:
    if device != "cuda":
        return 0
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


def time_batches(engine: Engine, batches: list, device: str) -> dict:
    runner = engine.gpu_runner
    attn = getattr(runner, "masked_attn", None) or getattr(runner, "eager_attn", None)
    plan = getattr(attn, "plan", None)
    plan_s, groups = [0.0], []
    if plan is not None:  # time the host side of each plan, and count its groups

        def timed_plan(*args: object, **kwargs: object) -> None:
            t = time.perf_counter()
            plan(*args, **kwargs)
            plan_s[0] += time.perf_counter() - t
            groups.append(len(getattr(attn, "_groups", ())))

        attn.plan = timed_plan
    allocs = device_allocs(device)
    tokens, t = 0, time.perf_counter()
    try:
        for flat, offsets in batches:
            engine.embed(flat, offsets)
            tokens += int(offsets[-1])
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        if plan is not None:
            attn.plan = plan
    seconds = time.perf_counter() - t
    return {
        "tok_s": tokens / seconds,
        "ms_per_batch": seconds / len(batches) * 1000,
        "plan_ms_per_batch": plan_s[0] / len(batches) * 1000,
        "groups_per_batch": float(np.mean(groups)) if groups else None,
        "device_allocs": device_allocs(device) - allocs,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-masked-probe"))
    ap.add_argument("--family", default="mpnet", help="a masked family of bench/family_models")
    ap.add_argument("--batches", type=int, default=12, help="batches a run")
    ap.add_argument("--texts", type=int, default=2500)
    ap.add_argument("--quick", action="store_true", help="tiny shapes on CPU")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    if args.quick:
        args.batches, args.texts = 2, 120
    ids = tokenize(load_texts(DEFAULT_CORPUS)[: args.texts])
    path = Path(tempfile.mkdtemp(prefix="masked-probe-")) / args.family
    build(FAMILIES[args.family], path, args.quick, device)
    engine = Engine.load(path, device=device, max_batch_tokens=BUDGET)
    repeat = draws(ids, args.batches, seed=0)
    runner = engine.gpu_runner
    engine_attn = type(runner.masked_attn).__name__ if runner is not None else "cpu"
    results: dict = {"family": args.family, "device": device, "torch": torch.__version__,
                     "masked_backend": engine_attn, "runs": {}}  # fmt: skip
    seed = 1
    masked = runner.masked_attn if runner is not None else None
    for backend in BACKENDS if device == "cuda" else ("no-cudnn",):
        try:
            with sdpa_backends(masked, BACKENDS[backend]):
                time_batches(engine, repeat, device)  # seen from here on
                runs = {"repeat": time_batches(engine, repeat, device)}
                runs["fresh"] = time_batches(engine, draws(ids, args.batches, seed), device)
                seed += 1
        except Exception as exc:  # a backend that refuses a float mask or these shapes
            runs = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        results["runs"][backend] = runs
        for name, r in runs.items():
            if isinstance(r, dict):
                print(f"{backend:9s} {name:6s} {r['tok_s'] / 1e6:.3f} M tok/s, "
                      f"{r['ms_per_batch']:.1f} ms/batch (plan {r['plan_ms_per_batch']:.1f}), "
                      f"{r['groups_per_batch']} groups, {r['device_allocs']} cudaMallocs",
                      flush=True)  # fmt: skip
            else:
                print(f"{backend:9s} {r}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "masked-probe.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Where the host's time goes per batch on the GPU path: ``Engine.embed`` plus the worker
pipeline's launch (finalize and result copies), under cProfile.

A small model's 16k-token batch takes ~2 ms on the H200, so if the host needs longer than
that to launch one, the GPU waits on Python. This runs the same FCFS batches as
``bench/gpu_engine.py`` through ``ResultPipeline.launch``/``collect`` (collecting two behind,
as the worker does) and prints the host milliseconds per batch and the top functions.

    python3 bench/gpu_host_profile.py [--model DIR] [--batches 100]
    python3 bench/gpu_host_profile.py --query [--gap-ms 2]   # one idle 16-token query

``--query``: one 16-token query at a time, as an idle worker serves it (launch, then collect),
``--gap-ms`` apart (an idle worker's thread has slept before each), against the engine alone
(``embed(...).cpu()``), then the query path under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_engine import BUDGET, MINILM_DIR, fcfs_batches, make_texts, workload  # noqa: E402
from mesh.worker.engine.engine import Engine  # noqa: E402
from mesh.worker.pipeline import ResultPipeline  # noqa: E402
from proto_msgs import BatchAssign, OutputOptions  # noqa: E402


def assignments(n_texts: int) -> list[BatchAssign]:
    _, ids = make_texts(workload(n_texts))
    out = []
    for i, (tokens, offsets) in enumerate(fcfs_batches(ids, BUDGET)):
        out.append(
            BatchAssign(
                batch_id=i,
                model="m",
                timeout_ms=60_000,
                outputs=[OutputOptions()],
                output_index=np.zeros(len(offsets) - 1, dtype=np.int32),
                token_ids=tokens,
                offsets=offsets,
            )
        )
    return out


def run(pipe: ResultPipeline, batches: list[BatchAssign]) -> list[float]:
    """Host seconds of each launch, with two batches in flight."""
    pending, host = [], []
    for b in batches:
        t = time.perf_counter()
        pending.append(pipe.launch(b))
        host.append(time.perf_counter() - t)
        if len(pending) == 2:
            pipe.collect(pending.pop(0))
    for p in pending:
        pipe.collect(p)
    return host


def query_profile(engine: Engine, pipe: ResultPipeline, gap_s: float, n: int = 300) -> None:
    query = BatchAssign(
        batch_id=0,
        model="m",
        timeout_ms=60_000,
        outputs=[OutputOptions()],
        output_index=np.zeros(1, dtype=np.int32),
        token_ids=np.array([101, *range(2000, 2014), 102], dtype=np.int32),
        offsets=np.array([0, 16], dtype=np.int32),
    )
    engine.warmup([16])

    def timed(fn) -> list[float]:  # noqa: ANN001
        out = []
        for _ in range(n):
            time.sleep(gap_s)
            t = time.perf_counter()
            fn()
            out.append(1000 * (time.perf_counter() - t))
        return out[n // 5 :]

    launch: list[float] = []

    def through_pipeline() -> None:
        t = time.perf_counter()
        launched = pipe.launch(query)
        launch.append(1000 * (time.perf_counter() - t))
        pipe.collect(launched)

    alone = timed(lambda: engine.embed(query.token_ids, query.offsets).cpu())
    whole = timed(through_pipeline)
    print(
        f"16-token query, {1000 * gap_s:.1f} ms apart, median ms: engine alone {np.median(alone):.3f}; "
        f"pipeline launch {np.median(launch[n // 5 :]):.3f}, launch + collect {np.median(whole):.3f}"
    )
    prof = cProfile.Profile()
    prof.enable()
    timed(through_pipeline)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=MINILM_DIR)
    ap.add_argument("--texts", type=int, default=5000)
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--query", action="store_true", help="profile one idle 16-token query")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="--query: sleep between queries")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(platform.processor() or platform.machine(), os.cpu_count(), "cpus;", os.getloadavg())
    print("torch threads", torch.get_num_threads(), "switch interval", sys.getswitchinterval())
    engine = Engine.load(args.model, device="cuda", max_batch_tokens=BUDGET, kernels=args.kernels)
    pipe = ResultPipeline(engine, engine.device, depth=2)
    if args.query:
        query_profile(engine, pipe, args.gap_ms / 1000)
        return
    batches = assignments(args.texts)
    run(pipe, batches)  # warm: captures the buckets met
    run(pipe, batches)
    torch.cuda.synchronize()
    t = time.perf_counter()
    host = run(pipe, batches)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    tokens = sum(int(b.offsets[-1]) for b in batches)
    print(
        f"{len(batches)} batches, {tokens / wall / 1e6:.2f} M tok/s; host ms per launch: "
        f"median {1000 * np.median(host):.3f}, p90 {1000 * np.percentile(host, 90):.3f}; "
        f"graphs {sorted(engine.runner.graphs)}"
    )
    prof = cProfile.Profile()
    prof.enable()
    run(pipe, batches)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())


if __name__ == "__main__":
    main()

"""How many tokens a second the mesh itself can move: broker, worker plumbing and the Python
client, with an engine that computes nothing.

The worker process runs the real ``WorkerServer`` (link, compute loop, finisher, encoding)
around ``NullEngine``, which returns zero vectors at once, optionally after sleeping a fixed
time per batch (``--batch-ms``) to stand in for a device. The client side is the same as
``bench/gpu_engine.py``'s mesh column: the same 20,000-text workload (seed 20261202),
``MeshClient.embed_tokens`` requests of ``--per-request`` texts, at most ``--in-flight``
requests outstanding. What this says: the ceiling the mesh puts on an engine's throughput on
this host, which is the bar column (3) of the GPU benchmark cannot pass.

    python bench/mesh_overhead.py                     # null engine
    python bench/mesh_overhead.py --batch-ms 2.4      # a device that takes 2.4 ms a batch
    python bench/mesh_overhead.py --transport ipc --inline-max-ms 0   # as --role all; no
                                                      # inline path (docs/benchmarks.md)
    python bench/mesh_overhead.py --model DIR --device cuda   # a real engine in the worker
    python bench/mesh_overhead.py --idle 2000 --transport ipc  # one 16-token query at a time:
                                                      # the mesh's own idle cost, per hop
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_engine import drive_mesh, workload  # noqa: E402
from mesh.worker.engine.runner import EngineBatch, EngineOutputs  # noqa: E402
from mesh.worker.server import INLINE_MAX_MS  # noqa: E402
from proto_msgs import ModelInfo  # noqa: E402

DIMS = 384
VOCAB = 30522


class NullEngine:
    """Zero vectors for every sequence, after ``batch_ms`` of sleep (the GIL is free)."""

    device = torch.device("cpu")
    has_lexical = False

    def run(self, batch: EngineBatch) -> EngineOutputs:
        # Only a skip the batch has is passed on, so that fakes without prompts take none.
        args = () if batch.skip is None else (batch.skip,)
        return EngineOutputs(self.embed(batch.ids, batch.offsets, *args))

    def __init__(self, batch_ms: float) -> None:
        self.batch_s = batch_ms / 1000

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        if self.batch_s:
            time.sleep(self.batch_s)
        return torch.zeros(len(offsets) - 1, DIMS)


def null_worker(batch_ms: float) -> tuple[NullEngine, ModelInfo, bytes]:
    tokenizer = b"{}"  # no client here tokenizes; the broker checks only its digest
    digest = hashlib.sha256(tokenizer).hexdigest()
    info = ModelInfo("null", [], DIMS, 512, VOCAB, "mean", True, digest)
    torch.set_num_threads(1)  # no OpenMP spinning to blur the core shares
    return NullEngine(batch_ms), info, tokenizer


def model_worker(model_dir: str, device: str, budget: int) -> tuple[object, ModelInfo, bytes]:
    """A real engine, served as "null" so the client side stays the same; CUDA graphs of
    the small buckets captured first, as docs/gpu.md's mesh runs do."""
    from mesh.worker.engine.engine import Engine

    engine = Engine.load(model_dir, device=device, max_batch_tokens=budget)
    engine.warmup([16, 64, 256])
    info = ModelInfo(
        "null", [], engine.card.dims, engine.card.max_input_tokens, engine.vocab_size,
        engine.card.pooling, engine.card.normalize, engine.card.tokenizer_digest,
    )  # fmt: skip
    return engine, info, engine.card.tokenizer_json


def run_worker(backend: str, args: argparse.Namespace) -> None:
    import zmq

    from mesh.config import Liveness
    from mesh.worker.server import WorkerOptions, WorkerServer

    if args.model:
        engine, info, tokenizer = model_worker(args.model, args.device, args.budget)
    else:
        engine, info, tokenizer = null_worker(args.batch_ms)
    inline = args.inline_max_ms
    if inline is None and not args.model:
        # The null engine stands in for a GPU's quick forwards: the GPU worker's inline path,
        # as every null-engine number in docs/benchmarks.md was measured.
        inline = INLINE_MAX_MS
    options = WorkerOptions("null", 2, args.budget, 4096, args.device, inline_max_ms=inline)
    ctx = zmq.Context()
    server = WorkerServer(ctx, engine, info, tokenizer, backend, options, Liveness())  # type: ignore[arg-type]
    if os.environ.get("WORKER_PROFILE"):  # cProfile of the link thread (the inline path)
        profile_link(server, os.environ["WORKER_PROFILE"])
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.run()
    print("worker:", server.stats.summary(), file=sys.stderr)


def profile_link(server: object, out: str) -> None:
    """Run the worker's link thread under cProfile, its stats written to ``out`` as it ends."""
    import cProfile

    link = server.link  # type: ignore[attr-defined]
    run = link._run

    def profiled() -> None:
        profile = cProfile.Profile()
        profile.enable()
        try:
            run()
        finally:
            profile.disable()
            profile.dump_stats(out)

    link._thread = threading.Thread(target=profiled, name="broker-link", daemon=True)


def random_ids(lengths: np.ndarray) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(1000, VOCAB, size=int(n), dtype=np.int32) for n in lengths]


async def idle_queries(front: str, count: int) -> dict:
    """``count`` single 16-token queries, one at a time after 200 of warm-up: the latency a
    client sees and the per-hop p50s its results carry (``EmbedResult.timings``)."""
    import uvloop

    from bench.stats import percentile
    from mesh.client import MeshClient

    uvloop.install()  # as the ingress runs its loop
    client = MeshClient(front, default_timeout_s=60)
    await client.start()
    await client.wait_ready(120, model="null")
    ids = np.array([101, *range(2000, 2014), 102], dtype=np.int32)
    offsets = np.array([0, len(ids)], dtype=np.int32)
    lat: list[float] = []
    hops: dict[str, list[float]] = {}
    for i in range(200 + count):
        t = time.perf_counter()
        result = await client.embed_tokens(ids, offsets, model="null")
        if i >= 200:
            lat.append((time.perf_counter() - t) * 1000)
            for name, ms in result.timings.items():
                hops.setdefault(name, []).append(ms)
    await client.close()
    return {
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "hops_p50_ms": {k: round(percentile(v, 50), 3) for k, v in hops.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-ms", type=float, default=0.0)
    ap.add_argument("--texts", type=int, default=20000)
    ap.add_argument("--per-request", type=int, default=16)
    ap.add_argument("--in-flight", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--transport", choices=("tcp", "ipc"), default="tcp")
    ap.add_argument(
        "--inline-max-ms",
        type=float,
        default=None,
        help="the worker's WorkerOptions.inline_max_ms (0: every batch through its threads;"
        " default: the GPU's bound for the null engine, the worker's own for --model, which"
        " on CPU runs every forward on its compute thread)",
    )
    ap.add_argument(
        "--idle", type=int, default=0, metavar="N",
        help="instead: N single 16-token queries one at a time; p50/p90 and per-hop p50",
    )  # fmt: skip
    ap.add_argument("--model", help="serve this model directory instead of the null engine")
    ap.add_argument("--device", default="cpu", help="the --model engine's device")
    ap.add_argument("--worker", metavar="BACKEND", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        run_worker(args.worker, args)
        return
    base = None  # the ipc endpoints' directory, removed at the end
    if args.transport == "ipc":  # what mesh-launch --role all uses
        base = tempfile.mkdtemp(prefix="mesh-overhead-")
        front, back = f"ipc://{base}/front", f"ipc://{base}/back"
    else:
        port = 18000 + os.getpid() % 1000 * 2
        front, back = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    broker = [sys.executable, "-m", "launch.cli", "--role", "broker"]
    if os.environ.get("BROKER_PROFILE"):  # cProfile of the broker process, written as it stops
        broker[1:1] = ["-m", "cProfile", "-o", os.environ["BROKER_PROFILE"]]
    procs = [
        subprocess.Popen([*broker, "--frontend", front, "--backend", back], cwd=ROOT),
        subprocess.Popen(
            [sys.executable, __file__, "--worker", back, *sys.argv[1:]],
            cwd=ROOT,
        ),
    ]
    try:
        pids = {"client": os.getpid(), "broker": procs[0].pid, "worker": procs[1].pid}
        lengths = workload(args.texts)
        if args.idle:
            prof = None
            if os.environ.get("IDLE_PROFILE"):
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            result = asyncio.run(idle_queries(front, args.idle))
            if prof is not None:
                prof.disable()
                prof.dump_stats(os.environ["IDLE_PROFILE"])
            print(json.dumps(result))
            return
        result = asyncio.run(
            drive_mesh(
                front,
                random_ids(lengths),
                int(lengths.sum()),
                [args.per_request],
                pids,
                model="null",
                in_flight=args.in_flight,
            )
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    result.update(vars(args), cpus=os.cpu_count())
    result.pop("worker")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

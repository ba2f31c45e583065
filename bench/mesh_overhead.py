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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_engine import workload  # noqa: E402

DIMS = 384
VOCAB = 30522


class NullEngine:
    """Zero vectors for every sequence, after ``batch_ms`` of sleep (the GIL is free)."""

    device = torch.device("cpu")

    def __init__(self, batch_ms: float) -> None:
        self.batch_s = batch_ms / 1000

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        if self.batch_s:
            time.sleep(self.batch_s)
        return torch.zeros(len(offsets) - 1, DIMS)


def run_worker(backend: str, batch_ms: float, budget: int) -> None:
    import zmq

    from mesh.config import Liveness
    from mesh.worker.server import WorkerOptions, WorkerServer
    from proto_msgs import ModelInfo

    info = ModelInfo(
        name="null",
        aliases=[],
        dims=DIMS,
        max_input_tokens=512,
        vocab_size=VOCAB,
        pooling="mean",
        normalize=True,
        tokenizer_digest="0" * 64,
    )
    torch.set_num_threads(1)  # no OpenMP spinning to blur the core shares
    options = WorkerOptions("null", 2, budget, 4096, "cpu")
    ctx = zmq.Context()
    server = WorkerServer(ctx, NullEngine(batch_ms), info, b"{}", backend, options, Liveness())
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.run()
    print("worker:", server.stats.summary(), file=sys.stderr)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(
    front: str, lengths: np.ndarray, per_request: int, in_flight: int, pids: dict[str, int]
) -> dict:
    from mesh.client import MeshClient

    rng = np.random.default_rng(0)
    ids = [rng.integers(1000, VOCAB, size=int(n), dtype=np.int32) for n in lengths]
    requests = []
    for i in range(0, len(ids), per_request):
        part = ids[i : i + per_request]
        offsets = np.zeros(len(part) + 1, dtype=np.int32)
        np.cumsum([len(s) for s in part], out=offsets[1:])
        requests.append((np.concatenate(part), offsets))
    client = MeshClient(front, default_timeout_s=600)
    await client.start()
    await client.wait_ready(60, model="null")
    gate = asyncio.Semaphore(in_flight)

    async def one(batch: tuple[np.ndarray, np.ndarray]) -> None:
        async with gate:
            await client.embed_tokens(*batch, model="null")

    rates = []
    tokens = int(lengths.sum())
    for _ in range(2):
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        t = time.perf_counter()
        await asyncio.gather(*(one(r) for r in requests))
        wall = time.perf_counter() - t
        rates.append(tokens / wall)
    # The share of one core each process kept busy in the timed pass: a process near 1.0
    # is the bottleneck.
    busy = {k: round((cpu_seconds(p) - before[k]) / wall, 2) for k, p in pids.items()}
    query = (np.arange(1000, 1016, dtype=np.int32), np.array([0, 16], dtype=np.int32))
    lat = []
    for i in range(300):
        t = time.perf_counter()
        await client.embed_tokens(*query, model="null")
        if i >= 50:
            lat.append(1000 * (time.perf_counter() - t))
    await client.close()
    return {
        "tok_s": rates[-1],
        "warm_pass_tok_s": rates[0],
        "tokens": tokens,
        "core_share": busy,
        "latency16_ms_p50": float(np.median(lat)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-ms", type=float, default=0.0)
    ap.add_argument("--texts", type=int, default=20000)
    ap.add_argument("--per-request", type=int, default=16)
    ap.add_argument("--in-flight", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--worker", metavar="BACKEND", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        run_worker(args.worker, args.batch_ms, args.budget)
        return
    port = 18000 + os.getpid() % 1000 * 2
    front, back = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    broker = [sys.executable, "-m", "launch.cli", "--role", "broker"]
    procs = [
        subprocess.Popen([*broker, "--frontend", front, "--backend", back], cwd=ROOT),
        subprocess.Popen(
            [sys.executable, __file__, "--worker", back, "--batch-ms", str(args.batch_ms)]
            + ["--budget", str(args.budget)],
            cwd=ROOT,
        ),
    ]
    try:
        pids = {"client": os.getpid(), "broker": procs[0].pid, "worker": procs[1].pid}
        result = asyncio.run(
            drive(front, workload(args.texts), args.per_request, args.in_flight, pids)
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(20)
    result.update(vars(args), cpus=os.cpu_count())
    result.pop("worker")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

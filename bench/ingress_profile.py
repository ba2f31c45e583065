"""Where one ingress process spends its CPU under bulk load through HTTP, with a worker that
computes nothing: the ingress's own share (HTTP, admission, rendering, ZMQ) against its
tokenizer children's.

A broker, a worker around ``bench.mesh_overhead.NullEngine`` (zero vectors at once) that
announces the embedded model's card (so the ingress tokenizes with its real tokenizer), and
one ingress under cProfile (its event loop thread), then ``mesh-bench`` closed-loop bulk
(64 corpus texts a request, base64) from a separate process. Prints the throughput, the CPU
seconds of the ingress process and of its tokenizer children per request, and the ingress
thread's top functions. What it says: how much of an ingress's CPU a faster tokenizer could
save, and what else there is (issue 8's MiniLM bulk target is bound by the ingress tier's CPU
on the H200 host, docs/gpu.md).

    python bench/ingress_profile.py [--seconds 15] [--concurrency 8] [--processes 3]

``PROFILE_TOP=N`` prints N functions instead of 18.
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 18555
ROW = re.compile(r"\sclosed\s.*?\s(\d+)/\d+\s+[\d.]+\s")


def serve_null_worker(backend: str) -> None:
    """The worker process: NullEngine behind the real WorkerServer, the embedded card's."""
    import torch
    import zmq

    from bench.mesh_overhead import DIMS, NullEngine
    from mesh.config import Liveness
    from mesh.worker.engine.card import default_model_path, read_card
    from mesh.worker.server import WorkerOptions, WorkerServer
    from proto_msgs import ModelInfo

    card = read_card(default_model_path())
    info = ModelInfo(
        card.name, [], DIMS, card.max_input_tokens, 30522, "mean", True, card.tokenizer_digest
    )
    torch.set_num_threads(1)
    options = WorkerOptions("null", 2, 16384, 4096, "cpu")
    server = WorkerServer(
        zmq.Context(), NullEngine(0.0), info, card.tokenizer_json, backend, options, Liveness()
    )  # type: ignore[arg-type]
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.run()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, its live children's), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own(pid), sum(own(int(k)) for k in kids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--processes", type=int, default=3, help="tokenizer children (0: threads)")
    ap.add_argument("--worker", metavar="BACKEND", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        serve_null_worker(args.worker)
        return
    base = tempfile.mkdtemp(prefix="ingress-profile-")
    front, back = f"ipc://{base}/front", f"ipc://{base}/back"
    prof = f"{base}/ingress.prof"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    launch = [sys.executable, "-m", "launch.cli"]
    procs = [
        subprocess.Popen(
            [*launch, "--role", "broker", "--frontend", front, "--backend", back], env=env, cwd=ROOT
        ),
        subprocess.Popen([sys.executable, __file__, "--worker", back], env=env),
    ]
    ingress = subprocess.Popen(
        [sys.executable, "-m", "cProfile", "-o", prof, "-m", "launch.cli", "--role", "ingress",
         "--broker", front, "--http-port", str(PORT), "--ingress-procs", "1",
         "--tokenize-processes", str(args.processes), "--auto-truncate"],
        env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit(f"the mesh did not answer /health on port {PORT} within 60 s")
        before = cpu_seconds(ingress.pid)
        bench = subprocess.run(
            [sys.executable, "-m", "bench.cli", "--no-baseline", "--engine-budgets", "",
             "--url", f"http://127.0.0.1:{PORT}/v1", "--encoding-format", "base64",
             "--mode", "closed", "--concurrency", str(args.concurrency),
             "--texts-per-request", "64", "--duration", str(args.seconds), "--warmup", "0",
             "--procs", "1"],
            env=env, cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        after = cpu_seconds(ingress.pid)
        # The report's row: "URL  closed  8 clients x64  784/784  65.3  4086.3  492015 ..."
        row = next((ln for ln in bench.stdout.splitlines() if ROW.search(ln)), "")
        print(row.strip() or bench.stdout[-2000:] + bench.stderr[-2000:])
        found = ROW.search(row)
        requests = max(1, int(found.group(1))) if found else 1
        parent, kids = after[0] - before[0], after[1] - before[1]
        print(
            f"ingress CPU over {args.seconds:.0f} s: its own process {parent:.2f} s "
            f"({1000 * parent / requests:.1f} ms a request), its tokenizer children "
            f"{kids:.2f} s ({1000 * kids / requests:.1f} ms a request)"
        )
        ingress.send_signal(signal.SIGINT)  # drains and exits: cProfile writes its stats
        ingress.wait(60)
        print("the ingress's event loop thread, by own time:")
        pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(
            int(os.environ.get("PROFILE_TOP", "18"))
        )
    finally:
        for p in [ingress, *procs]:  # whatever is still up after a failure, too
            if p.poll() is None:
                p.terminate()
        for p in [ingress, *procs]:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

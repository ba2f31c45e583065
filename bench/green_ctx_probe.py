"""Would reserving SMs for the live lane shorten a live query's GPU time under bulk? (H200)

A live query's forward under saturating bulk took 1.8 ms at p50 and 4.5 ms at p99 on the H200
against 0.7 ms idle (docs/gpu.md, eighth session): its kernels, on a stream of the highest
priority, still wait for SMs that bulk blocks hold. A CUDA green context can confine the bulk
work to all SMs but ``k``, so that the live stream (on the primary context, all SMs) always
finds ``k`` free. This probe measures that at the kernel level, not through the mesh:

- bulk: a thread looping MiniLM-sized FFN GEMMs over 16,384 rows (fp16), two iterations in
  flight, on a plain stream or on a stream of a green context of ``SMs - k`` SMs;
- live: a CUDA graph of a 16-row chain of 24 small GEMM + GELU pairs (about a MiniLM forward's
  kernel count), replayed every 5 ms on a high-priority stream, timed by CUDA events (GPU
  time from the graph's start to its end) and by the host (launch to sync).

Variants: idle (no bulk), bulk on the primary context, bulk confined to ``SMs - k`` for each
``--reserve k``. Reported: live p50 / p90 / p99 (GPU and host) and the bulk thread's GEMM
rate, so that what the reservation costs bulk is beside what it gives live.

    python3 bench/green_ctx_probe.py --out OUT.json [--reserve 8,16] [--queries 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

ROWS, HIDDEN, FFN = 16384, 384, 1536
LIVE_ROWS, LIVE_LAYERS = 16, 24
_CONTEXTS: list[Any] = []  # a green context freed while its stream runs would end the probe
API: list[str] = []  # which green-context API this torch offered


def _green_stream(num_sms: int) -> torch.cuda.Stream:
    """In the calling (bulk) thread: a stream whose kernels run on ``num_sms`` SMs only,
    whichever green-context API this torch has."""
    from torch.cuda.green_contexts import GreenContext

    try:
        ctx = GreenContext.create(num_sms=num_sms, device_id=0)
    except TypeError:  # 2.10/2.11: positional
        ctx = GreenContext.create(num_sms, 0)
    _CONTEXTS.append(ctx)
    if hasattr(ctx, "Stream"):
        API.append("GreenContext.Stream")
        return ctx.Stream()
    # Older API: the context is made current on this thread (for the rest of the thread's
    # life: the bulk thread ends with the variant) and brings its own current stream.
    API.append("set_context + current_stream")
    ctx.set_context()
    return torch.cuda.current_stream()


def _bulk_loop(
    setup: Callable[[], torch.cuda.Stream],
    ready: threading.Event,
    stop: threading.Event,
    counts: list[int],
    errors: list[str],
) -> None:
    try:
        stream = setup()
        with torch.cuda.stream(stream):
            x = torch.randn(ROWS, HIDDEN, device="cuda", dtype=torch.float16)
            up = torch.randn(HIDDEN, FFN, device="cuda", dtype=torch.float16) * 0.05
            down = torch.randn(FFN, HIDDEN, device="cuda", dtype=torch.float16) * 0.05
            events: list[torch.cuda.Event] = []
            while not stop.is_set():
                for _ in range(6):  # six layers' FFNs
                    x = torch.nn.functional.gelu(x @ up) @ down
                done = torch.cuda.Event()
                done.record(stream)
                events.append(done)
                if len(events) > 2:  # two iterations in flight, no unbounded queue
                    events.pop(0).synchronize()
                counts[0] += 6
                ready.set()
            stream.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported by the variant
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        ready.set()


def _live_graph(stream: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    x = torch.randn(LIVE_ROWS, HIDDEN, device="cuda", dtype=torch.float16)
    ws = [
        torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.float16) * 0.05
        for _ in range(LIVE_LAYERS)
    ]

    def forward() -> torch.Tensor:
        y = x
        for w in ws:
            y = torch.nn.functional.gelu(y @ w)
        return y

    with torch.cuda.stream(stream):
        forward()  # warm (cuBLAS handles, workspaces)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = forward()
    return graph, out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def measure(bulk_setup: Callable[[], torch.cuda.Stream] | None, queries: int) -> dict[str, Any]:
    live_stream = torch.cuda.Stream(priority=-100)  # the lane's: highest priority
    graph, _ = _live_graph(live_stream)
    ready, stop, counts, errors = threading.Event(), threading.Event(), [0], []
    bulk = None
    if bulk_setup is not None:
        args = (bulk_setup, ready, stop, counts, errors)
        bulk = threading.Thread(target=_bulk_loop, args=args, daemon=True)
        bulk.start()
        ready.wait(60)
        time.sleep(1.0)  # bulk at full speed first
        if errors:
            raise RuntimeError(errors[0])
    gpu_ms: list[float] = []
    host_ms: list[float] = []
    start_count, t_start = counts[0], time.perf_counter()
    for _ in range(queries):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        with torch.cuda.stream(live_stream):
            begin.record(live_stream)
            graph.replay()
            end.record(live_stream)
        end.synchronize()
        host_ms.append((time.perf_counter() - t0) * 1000)
        gpu_ms.append(begin.elapsed_time(end))
        time.sleep(0.005)
    elapsed = time.perf_counter() - t_start
    gemms = counts[0] - start_count
    stop.set()
    if bulk is not None:
        bulk.join(timeout=10)
    torch.cuda.synchronize()
    if errors:
        raise RuntimeError(errors[0])
    row = {
        f"live_{kind}_p{q}": round(_pct(v, q), 3)
        for kind, v in (("gpu", gpu_ms), ("host", host_ms))
        for q in (50, 90, 99)
    }
    # One FFN = two GEMMs of 2*ROWS*HIDDEN*FFN flops each.
    row["bulk_tflops"] = round(gemms * 4 * ROWS * HIDDEN * FFN / elapsed / 1e12, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reserve", default="8,16", help="SMs kept from bulk, comma list")
    parser.add_argument("--queries", type=int, default=400)
    args = parser.parse_args()
    sys.setswitchinterval(0.0005)  # as the worker: the two threads share the GIL
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results: dict[str, Any] = {"sms": sms, "torch": torch.__version__, "variants": {}}

    def run(name: str, setup: Callable[[], torch.cuda.Stream] | None) -> None:
        try:
            results["variants"][name] = measure(setup, args.queries)
        except Exception as exc:  # noqa: BLE001 - a variant that cannot run is recorded
            results["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, results["variants"][name], flush=True)

    run("idle", None)
    run("bulk", torch.cuda.Stream)
    for k in (int(v) for v in args.reserve.split(",") if v):
        run(f"bulk_reserve_{k}", lambda k=k: _green_stream(sms - k))
    run("bulk_again", torch.cuda.Stream)  # drift check
    results["api"] = API
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

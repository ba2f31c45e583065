"""Rerank throughput through HTTP beside sentence-transformers ``CrossEncoder.predict`` in the
same run: pairs/s and tokens/s, 1 query x 100 passages per request.

    mesh-bench rerank --model ./ms-marco-MiniLM-L6-v2 --mesh-args "--gpu 0" --device cuda

Brings a mesh up (``mesh-launch --role all --model DIR --auto-truncate`` plus ``--mesh-args``),
sends ``--requests`` TEI ``/rerank`` requests of one corpus query and ``--passages`` corpus
passages each, ``--concurrency`` at a time (closed loop, after a warm-up of as many), and
reads each answer's ``x-compute-tokens``; then stops the mesh and times
``CrossEncoder.predict`` on the same pairs on ``--device`` (the device is the mesh's no longer).
Prints one JSON object: pairs/s, tokens/s, latency p50/p99 of the mesh, pairs/s of the
baseline, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp
import orjson

from bench.corpus import DEFAULT_CORPUS, load_texts
from bench.spawn import SpawnedMesh


def workload(corpus: Path, requests: int, passages: int) -> list[tuple[str, list[str]]]:
    """``requests`` (query, passages) of the corpus: queries and passages cycled in order."""
    queries = load_texts(corpus, kind="query")
    docs = load_texts(corpus, kind="passage")
    out = []
    for i in range(requests):
        start = (i * passages) % len(docs)
        chunk = (docs[start:] + docs)[:passages]
        out.append((queries[i % len(queries)], chunk))
    return out


async def _one(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, int]:
    start = time.perf_counter()
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"/rerank answered {r.status}: {(await r.text())[:300]}")
        await r.read()
        return time.perf_counter() - start, int(r.headers.get("x-compute-tokens", "0"))


async def drive(url: str, work: list[tuple[str, list[str]]], concurrency: int) -> dict:
    """Closed loop: ``concurrency`` requests in flight until every one of ``work`` is done."""
    bodies = [orjson.dumps({"query": q, "texts": p, "truncate": True}) for q, p in work]
    latencies: list[float] = []
    tokens = 0
    async with aiohttp.ClientSession() as http:
        for body in bodies[:concurrency]:  # warm-up: tokenizer fetch, graphs, caches
            await _one(http, url, body)
        queue = list(bodies)
        start = time.perf_counter()

        async def loop() -> None:
            nonlocal tokens
            while queue:
                seconds, n = await _one(http, url, queue.pop())
                latencies.append(seconds)
                tokens += n

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    pairs = sum(len(p) for _, p in work)
    latencies.sort()
    return {
        "pairs_per_s": pairs / elapsed,
        "tokens_per_s": tokens / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "seconds": elapsed,
    }


def baseline(
    model: str, work: list[tuple[str, list[str]]], device: str, batch: int, dtype: str, pairs: int
) -> dict:
    """``CrossEncoder.predict`` on the first ``pairs`` pairs of ``work``: as users call it by
    default (fp32, batch 32) or tuned (``dtype`` bf16/fp16 weights, a bigger ``batch``)."""
    import torch
    from sentence_transformers import CrossEncoder

    kwargs = (
        {}
        if dtype == "fp32"
        else {"torch_dtype": getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype])}
    )
    ce = CrossEncoder(model, device=device, model_kwargs=kwargs)
    todo = [(q, p) for q, ps in work for p in ps][:pairs]
    ce.predict(todo[: batch * 2], batch_size=batch)  # warm-up
    start = time.perf_counter()
    ce.predict(todo, batch_size=batch)
    elapsed = time.perf_counter() - start
    return {"pairs_per_s": len(todo) / elapsed, "batch_size": batch, "dtype": dtype,
            "pairs": len(todo), "seconds": elapsed}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mesh-bench rerank", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="cross-encoder directory")
    parser.add_argument("--mesh-args", default="", help="more mesh-launch flags (--gpu 0)")
    parser.add_argument("--device", default="cpu", help="the baseline's torch device")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--baselines", default="fp32:32,bf16:128",
        help="CrossEncoder runs as DTYPE:BATCH (fp32:32 is its default); the best counts",
    )  # fmt: skip
    parser.add_argument("--baseline-pairs", type=int, default=10000, help="pairs each times")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)
    work = workload(args.corpus, args.requests, args.passages)
    with SpawnedMesh(f"--model {args.model} {args.mesh_args}") as mesh:
        url = mesh.url.removesuffix("/v1") + "/rerank"
        ours = asyncio.run(drive(url, work, args.concurrency))
        ours["mesh"] = mesh.describe()
    report = {"mesh": ours, "passages_per_request": args.passages, "requests": args.requests}
    if not args.no_baseline:
        runs = []
        for spec in args.baselines.split(","):
            dtype, batch = spec.split(":")
            runs.append(
                baseline(args.model, work, args.device, int(batch), dtype, args.baseline_pairs)
            )
        report["baselines"] = runs
        report["baseline"] = max(runs, key=lambda r: r["pairs_per_s"])
        report["ratio"] = ours["pairs_per_s"] / report["baseline"]["pairs_per_s"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

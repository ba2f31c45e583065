"""Through HTTP, for ``mesh-bench families``: dense models by ``mesh-bench`` (``/v1/embeddings``,
closed loop), sparse and multi-vector outputs, which mesh-bench does not send, by a closed loop of
our own on TEI's ``/embed_sparse`` and our ``/embed_multivector`` against one spawned mesh.

The closed loop here is mesh-bench's, reduced: ``procs`` processes of ``concurrency / procs``
clients, each request ``texts_per_request`` corpus texts (each process from its own place in the
corpus), a warm-up then a measured window that counts the requests completed inside it and their
``x-compute-tokens``; responses are read, not parsed.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from bench.corpus import DEFAULT_CORPUS, load_texts
from bench.spawn import SpawnedMesh

ROUTES = {
    "sparse": "/embed_sparse",
    "lexical": "/embed_sparse",
    "multivector": "/embed_multivector",
}


def mesh_bench(model: Path, name: str, spawn: str, load: dict, out: Path, timeout_s: float) -> dict:
    """``mesh-bench --spawn`` on ``model`` (served as ``name``): closed loop on /v1/embeddings;
    the measured window's rate, latency and CPU per role."""
    report = out / f"http-{name}.json"
    cmd = [
        sys.executable, "-m", "bench.cli", "--no-baseline", "--engine-budgets", "",
        "--spawn", f"{spawn} --model {model}", "--model-name", name,
        "--encoding-format", "base64", "--mode", "closed",
        "--concurrency", str(load["concurrency"]),
        "--texts-per-request", str(load["texts_per_request"]),
        "--procs", str(load["procs"]), "--duration", str(load["seconds"]),
        "--warmup", str(load["warmup"]), "--json", str(report),
    ]  # fmt: skip
    with (out / f"http-{name}.log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
    if done.returncode != 0 or not report.is_file():
        tail = (out / f"http-{name}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"mesh-bench exited {done.returncode}:\n{tail}")
    run = json.loads(report.read_text())["runs"][0]
    return {
        "tok_s": run["tokens_per_s"],
        "texts_per_s": run["texts_per_s"],
        "latency_ms": run["latency_ms"],
        "errors": run["errors"],
        "cpu_cores_by_role": run["cpu_cores_by_role"],
        "route": "/v1/embeddings",
    }


def drive_outputs(
    model: Path, outputs: list[str], spawn: str, load: dict, corpus: Path = DEFAULT_CORPUS
) -> dict[str, dict]:
    """One mesh on ``model``; for each output, the closed loop on its route."""
    results: dict[str, dict] = {}
    with SpawnedMesh(f"{spawn} --model {model}") as mesh:
        base = mesh.url.removesuffix("/v1")
        for output in outputs:
            per_request = load["texts_per_request"]
            if output == "multivector":
                # /embed_multivector answers at most 2^24 numbers: 16 texts of 512 tokens
                # of 1,024-wide vectors stay under it, 64 corpus passages may not.
                per_request = min(per_request, 16)
            body = {"truncate": True}
            if output == "multivector":
                body["encoding_format"] = "base64"
            results[output] = drive(base + ROUTES[output], corpus, per_request, body, load) | {
                "route": ROUTES[output],
                "texts_per_request": per_request,
            }
        for r in results.values():
            r["mesh"] = mesh.describe()
    return results


def drive(url: str, corpus: Path, per_request: int, extra: dict, load: dict) -> dict:
    """The closed loop over ``load['procs']`` processes, merged: tokens over the window."""
    procs = max(1, min(load["procs"], load["concurrency"]))
    clients = [
        load["concurrency"] // procs + (i < load["concurrency"] % procs) for i in range(procs)
    ]
    start_at = time.time() + 3.0  # every process starts its warm-up at the same instant
    jobs = [
        (url, str(corpus), per_request, extra, c, i, procs, start_at, load["warmup"], load["seconds"])
        for i, c in enumerate(clients)
    ]  # fmt: skip
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        parts = pool.starmap(_process, jobs)
    tokens = sum(p["tokens"] for p in parts)
    latencies = sorted(x for p in parts for x in p["latencies"])
    errors: dict[str, int] = {}
    for p in parts:
        for k, v in p["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "tok_s": tokens / load["seconds"],
        "requests": len(latencies),
        "latency_ms": {
            f"p{q}": 1000 * latencies[int(q / 100 * (len(latencies) - 1))] for q in (50, 99)
        }
        if latencies
        else {},  # fmt: skip
        "errors": errors,
    }


def _process(
    url: str, corpus: str, per_request: int, extra: dict, clients: int, index: int,
    procs: int, start_at: float, warmup: float, seconds: float,
) -> dict:  # fmt: skip
    texts = load_texts(corpus)
    offset = index * len(texts) // procs
    texts = texts[offset:] + texts[:offset]
    bodies = [
        orjson.dumps({"inputs": (texts[i:] + texts)[:per_request]} | extra)
        for i in range(0, len(texts), per_request)
    ]
    time.sleep(max(0.0, start_at - time.time()))
    return asyncio.run(_loop(url, bodies, clients, warmup, seconds))


async def _loop(url: str, bodies: list[bytes], clients: int, warmup: float, seconds: float) -> dict:
    begin = time.perf_counter()
    window = (begin + warmup, begin + warmup + seconds)
    out: dict = {"tokens": 0, "latencies": [], "errors": {}}
    headers = {"Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < window[1]:
                sent = time.perf_counter()
                try:
                    async with http.post(url, data=bodies[i % len(bodies)]) as r:
                        await r.read()
                        status, tokens = r.status, int(r.headers.get("x-compute-tokens", "0"))
                except (TimeoutError, aiohttp.ClientError) as exc:
                    status, tokens = type(exc).__name__, 0
                done = time.perf_counter()
                i += clients
                if not window[0] <= done <= window[1]:
                    continue
                if status == 200:
                    out["tokens"] += tokens
                    out["latencies"].append(done - sent)
                else:
                    out["errors"][str(status)] = out["errors"].get(str(status), 0) + 1

        await asyncio.gather(*(client(k) for k in range(clients)))
    return out

"""``--mode hops``: where one idle query's time goes, the same query four ways.

1. **engine**: the model the mesh serves, loaded in a process of our own (``python -m
   bench.hops``, so the load generator never imports torch), the pre-tokenized query through
   ``Engine.embed_final``; its tokenization is timed apart as the hop ``tokenize``;
2. **client**: ``MeshClient.embed_tokens`` to the broker, the same token ids (the way the GPU
   benchmark drives the mesh), hops from ``EmbedResult.timings``;
3. **http**: ``POST /v1/embeddings`` with the text, hops from the ``x-embedmesh-timings``
   response header (asked for with ``X-Embedmesh-Timings: 1``);
4. **http_floor**: the same client against a bare aiohttp server answering the body the
   mesh answered (:mod:`bench.http_floor`): what the HTTP stack costs with no ingress logic
   and no mesh behind it.

One query at a time, after a warm-up, each way. A way's hops are whatever names its source
reports (``ingress_parse``, ``broker_queue``, ``worker_compute``, ...); a name that never
arrives is not shown, so the report follows the mesh as its timings land.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.load import Target
from bench.stats import TIMINGS_HEADER, hop_percentiles, parse_timings, percentile

# Twelve words, every run the same: an idle query's cost is compared across ways and commits.
DEFAULT_QUERY = "how can a team keep live search fast while bulk indexing runs"


@dataclass
class Way:
    """One way of sending the query: each query's latency and its per-hop timings."""

    latencies_ms: list[float] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)
    errors: int = 0
    skipped: str = ""  # why this way was not measured ("" when it was)
    body: bytes = b""  # the last successful response (HTTP), for the floor to answer

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "count": len(lat),
            "errors": self.errors,
            "p50_ms": percentile(lat, 50),
            "p90_ms": percentile(lat, 90),
            "p99_ms": percentile(lat, 99),
            "hops_p50_ms": hop_p50s(self.timings),
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class Setup:
    """What ``--mode hops`` sends, and where."""

    query: str
    count: int  # queries measured per way
    warmup: int  # queries sent first, not measured
    model_name: str  # 'model' for HTTP and MeshClient
    engine_model: str | None  # model directory of the engine way (None: the embedded one)
    engine_device: str
    broker: str | None  # broker frontend for the client way (None: that way is skipped)


def measure(
    label: str, target: Target, setup: Setup, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """The four ways one after the other; the report's ``hops`` entry for ``label``."""
    s = setup
    say(f"{label} hops: engine alone ({s.engine_device}) ...")
    ways = {"engine": engine_way(s.engine_model, s.engine_device, s.query, s.count, s.warmup)}
    if s.broker:
        say(f"{label} hops: MeshClient to {s.broker} ...")
        ways["client"] = _run(client_way(s.broker, s.model_name, s.query, s.count, s.warmup))
    else:
        ways["client"] = Way(skipped="no broker endpoint: give --broker with --url")
    say(f"{label} hops: HTTP ...")
    ways["http"] = _run(
        http_way(target.url, s.model_name, s.query, s.count, s.warmup, target.api_key)
    )
    ways["http_floor"] = floor_way(ways["http"].body, s, say, label)
    summaries = {name: way.summary() for name, way in ways.items()}
    return {"config": label, "query": s.query, "count": s.count, "ways": summaries}


def floor_way(body: bytes, s: Setup, say: Callable[[str], None], label: str) -> Way:
    """The HTTP stack alone: the same client against :mod:`bench.http_floor` answering
    ``body`` (the mesh's answer to the query)."""
    from bench.http_floor import FloorServer

    if not body:
        return Way(skipped="no successful HTTP response to answer with")
    say(f"{label} hops: HTTP stack alone (bench.http_floor) ...")
    try:
        with FloorServer(body) as floor:
            return _run(http_way(floor.url, s.model_name, s.query, s.count, s.warmup))
    except (RuntimeError, OSError) as exc:  # the other ways' minutes are not lost with it
        return Way(skipped=f"the floor server failed: {exc}")


def _run(coro: Coroutine[Any, Any, Way]) -> Way:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def hop_p50s(timings: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per hop, the median over the queries that reported it; hops in first-seen order."""
    return hop_percentiles(timings, (50,))["p50"]


async def http_way(
    url: str, model: str, query: str, count: int, warmup: int, api_key: str | None = None
) -> Way:
    """``count`` sequential ``POST /v1/embeddings`` of the query, asking for the timings."""
    import aiohttp

    body = orjson.dumps({"model": model, "input": query, "encoding_format": "base64"})
    headers = {"Content-Type": "application/json", TIMINGS_HEADER: "1"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    way = Way()
    async with aiohttp.ClientSession(headers=headers) as session:
        for i in range(warmup + count):
            t0 = time.perf_counter()
            async with session.post(url.rstrip("/") + "/embeddings", data=body) as resp:
                answer = await resp.read()
                ms = (time.perf_counter() - t0) * 1000
                ok, header = resp.status == 200, resp.headers.get(TIMINGS_HEADER)
            if i < warmup:
                continue
            if not ok:
                way.errors += 1
                continue
            way.body = answer
            way.latencies_ms.append(ms)
            way.timings.append(parse_timings(header))
    return way


async def client_way(broker: str, model: str, query: str, count: int, warmup: int) -> Way:
    """``count`` sequential ``MeshClient.embed_tokens`` of the query's token ids."""
    from mesh.client import MeshClient
    from mesh.errors import MeshError

    way = Way()
    async with MeshClient(broker) as client:
        await client.wait_ready(60, model=model)
        ids, offsets = await client.tokenize([query], model, truncate=True)
        for i in range(warmup + count):
            t0 = time.perf_counter()
            try:
                result = await client.embed_tokens(ids, offsets, model)
            except MeshError:
                way.errors += i >= warmup
                continue
            ms = (time.perf_counter() - t0) * 1000
            if i >= warmup:
                way.latencies_ms.append(ms)
                # getattr: EmbedResult.timings is being added; until then, no hops.
                way.timings.append(dict(getattr(result, "timings", None) or {}))
    return way


def engine_way(model_dir: str | None, device: str, query: str, count: int, warmup: int) -> Way:
    """The engine alone, in a fresh interpreter (``main`` below); JSON back on stdout."""
    cmd = [sys.executable, "-m", "bench.hops", "--device", device, "--query", query]
    cmd += ["--count", str(count), "--warmup", str(warmup)]
    if model_dir:
        cmd += ["--model", model_dir]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return Way(skipped=f"engine process failed: {done.stderr.strip()[-500:]}")
    raw = json.loads(done.stdout)
    return Way(raw["latencies_ms"], raw["timings"])


def engine_from_spawn(spawn_args: str) -> tuple[str | None, str]:
    """The model directory and device a ``mesh-launch`` command line gives its workers
    (``None``: the embedded default model)."""
    args = shlex.split(spawn_args)
    model, device = None, "cpu"
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--model":
            model = value
        elif flag == "--device":
            device = value
        elif flag == "--gpu":
            device = f"cuda:{value}"
    for arg in args:  # --flag=value spellings
        flag, sep, value = arg.partition("=")
        if sep and flag == "--model":
            model = value
        elif sep and flag == "--device":
            device = value
    return model, device


def measure_engine(model_dir: str | None, device: str, query: str, count: int, warmup: int) -> Way:
    """Tokenize and embed the query ``count`` times in this process (after ``warmup``)."""
    import numpy as np
    from tokenizers import Tokenizer

    from mesh.worker.engine.card import default_model_path
    from mesh.worker.engine.engine import Engine

    engine = Engine.load(model_dir or default_model_path(), device=device)
    engine.warmup([16, 32])
    tok = Tokenizer.from_str(engine.card.tokenizer_json.decode("utf-8"))
    tok.no_padding()
    tok.enable_truncation(engine.card.max_input_tokens)
    way = Way()
    for i in range(warmup + count):
        t0 = time.perf_counter()
        ids = np.asarray(tok.encode(query).ids, dtype=np.int32)
        t1 = time.perf_counter()
        engine.embed_final(ids, np.array([0, len(ids)], dtype=np.int32))  # numpy: synchronized
        t2 = time.perf_counter()
        if i >= warmup:
            way.latencies_ms.append((t2 - t1) * 1000)
            way.timings.append({"tokenize": (t1 - t0) * 1000, "embed": (t2 - t1) * 1000})
    return way


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The engine way of mesh-bench --mode hops.")
    parser.add_argument("--model", help="model directory (default: the embedded model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--query", default=DEFAULT_QUERY)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    way = measure_engine(args.model, args.device, args.query, args.count, args.warmup)
    json.dump({"latencies_ms": way.latencies_ms, "timings": way.timings}, sys.stdout)


if __name__ == "__main__":
    main()

"""``mesh-bench index``: index a corpus three ways and watch live queries meanwhile.

The repository's corpus (``data/corpus.jsonl``) repeated ``--copies`` times is embedded
against one mesh (``--spawn FLAGS``, or ``--url``):

- **direct**: ``mesh-embed IN -o OUT.npy`` (live ``/v1/embeddings`` requests, batch lane);
- **batch**: ``mesh-embed IN -o OUT.npy --batch`` (OpenAI's Files and Batches API);
- **openai**: the loop a user writes: ``client.embeddings.create`` of ``--openai-batch-size``
  texts from ``--openai-concurrency`` threads of the official ``openai`` client.

Each way reports its wall time and tokens/s (the server's ``usage`` tokens over the wall time,
the command's start-up included). Meanwhile, and alone first (``idle``), a prober sends one
short query at a time on the interactive lane, at most ``--live-rate`` a second, each waiting
for its answer (a user's search box): its p50/p99 per way against idle is what bulk indexing
costs a live query. JSON with ``--json FILE``.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import orjson

from bench.corpus import DEFAULT_CORPUS, load_texts, request_bodies
from bench.load import Target, send
from bench.spawn import SpawnedMesh
from bench.stats import percentile

WAYS = ("direct", "batch", "openai")
SUMMARY = re.compile(r"([\d,]+) tokens in ([\d.]+) s")


class LiveProbe:
    """One interactive query at a time, at most ``rate`` a second, in a thread of its own."""

    def __init__(self, url: str, model: str, queries: list[str], rate: float) -> None:
        self.target, self.rate = Target(url), rate
        self.bodies = request_bodies(queries, model, 1, priority="interactive")
        self.latencies_ms: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with self.target.session(1) as session:
            n = 0
            while not self._stop.is_set():
                started = time.perf_counter()
                sample = await send(session, self.target.embeddings_url,
                                    self.bodies[n % len(self.bodies)], started)  # fmt: skip
                n += 1
                if sample.ok:
                    self.latencies_ms.append(sample.latency_s * 1000)
                else:
                    self.failures += 1
                await asyncio.sleep(max(0.0, 1 / self.rate - (time.perf_counter() - started)))

    def __enter__(self) -> LiveProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def summary(self) -> dict[str, Any]:
        xs = self.latencies_ms  # no answered query: null percentiles (JSON has no NaN)
        p50, p99 = (round(percentile(xs, q), 2) if xs else None for q in (50, 99))
        return {"queries": len(xs), "failures": self.failures, "p50_ms": p50, "p99_ms": p99}


def write_corpus(path: Path, texts: list[str], copies: int) -> int:
    """``texts`` ``copies`` times as JSON lines ``{id, text}``: the number of rows."""
    with path.open("wb") as f:
        for copy in range(copies):
            f.writelines(orjson.dumps({"id": f"{copy}-{i}", "text": t}) + b"\n"
                         for i, t in enumerate(texts))  # fmt: skip
    return copies * len(texts)


def served_model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=30) as resp:
        return str(json.load(resp)["data"][0]["id"])


def mesh_embed(url: str, model: str, source: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """``mesh-embed`` as a process: wall seconds and the tokens its summary line states."""
    argv = [sys.executable, "-m", "mesh.embed_cli", str(source), "-o", str(out), "--url", url,
            "--model", model, "--force", *extra]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise click.ClickException(f"{shlex.join(argv[2:])} exited {done.returncode}:\n"
                                   f"{done.stderr[-2000:]}")  # fmt: skip
    match = SUMMARY.search(done.stderr)
    tokens = int(match.group(1).replace(",", "")) if match else 0
    return {"seconds": seconds, "tokens": tokens, "command": shlex.join(["mesh-embed", *argv[3:]])}


def openai_loop(url: str, model: str, texts: list[str], threads: int, size: int) -> dict[str, Any]:
    """The plain loop: chunks of ``size`` texts through ``client.embeddings.create`` from
    ``threads`` threads, each vector decoded as the client does."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="unused", max_retries=8, timeout=600)
    chunks = [texts[i : i + size] for i in range(0, len(texts), size)]

    def embed(chunk: list[str]) -> int:
        answer = client.embeddings.create(model=model, input=chunk)
        assert len(answer.data) == len(chunk)
        return answer.usage.prompt_tokens

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        tokens = sum(pool.map(embed, chunks))
    return {"seconds": time.perf_counter() - started, "tokens": tokens,
            "command": f"openai client, {threads} threads x {size} texts a call"}  # fmt: skip


def measure(o: dict[str, Any], url: str, work: Path) -> dict[str, Any]:
    texts = load_texts(o["corpus"])
    queries = load_texts(o["corpus"], kind="query")[:200]
    model = o["model"] or served_model(url)
    source = work / "corpus.jsonl"
    rows = write_corpus(source, texts, o["copies"])
    report: dict[str, Any] = {"url": url, "model": model, "copies": o["copies"], "rows": rows,
                              "live_rate": o["live_rate"], "ways": {}}  # fmt: skip
    # First batches are slower (allocations, caches): a few hundred texts once, unmeasured.
    write_corpus(work / "warm.jsonl", texts[:256], 1)
    mesh_embed(url, model, work / "warm.jsonl", work / "warm.npy", ["--quiet"])
    with LiveProbe(url, model, queries, o["live_rate"]) as probe:
        time.sleep(o["idle_seconds"])
    report["live_idle"] = probe.summary()
    for way in o["ways"]:
        with LiveProbe(url, model, queries, o["live_rate"]) as probe:
            if way == "openai":
                result = openai_loop(url, model, [t for _ in range(o["copies"]) for t in texts],
                                     o["openai_concurrency"], o["openai_batch_size"])  # fmt: skip
            else:
                extra = ["--batch", "--poll-interval", str(o["poll_interval"])] if way == "batch" else []  # fmt: skip
                result = mesh_embed(url, model, source, work / f"{way}.npy", extra)
        result["tokens_per_s"] = round(result["tokens"] / result["seconds"], 1)
        result["texts_per_s"] = round(rows / result["seconds"], 1)
        result["live"] = probe.summary()
        report["ways"][way] = result
        print(_line(way, result), file=sys.stderr)
    report["summary"] = summary(report)
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Each way's tokens/s over the direct mode's, and live p50/p99 idle and during each way."""
    ways = report["ways"]
    base = ways.get("direct", {}).get("tokens_per_s")
    out: dict[str, Any] = {
        "live_ms": {"idle": [report["live_idle"]["p50_ms"], report["live_idle"]["p99_ms"]]}
    }
    for way, r in ways.items():
        out["live_ms"][way] = [r["live"]["p50_ms"], r["live"]["p99_ms"]]
        if base and way != "direct":
            out[f"{way}_over_direct"] = round(r["tokens_per_s"] / base, 3)
    return out


def _line(way: str, r: dict[str, Any]) -> str:
    live = r["live"]
    return (f"{way:>7}: {r['tokens_per_s']:>10,.0f} tokens/s {r['texts_per_s']:>8,.0f} texts/s "
            f"{r['seconds']:7.1f} s; live query p50 {live['p50_ms']} ms p99 {live['p99_ms']} ms "
            f"({live['queries']} queries)")  # fmt: skip


@click.command("index", context_settings={"show_default": True})
@click.option("--spawn", "spawn_args", default="", help="Flags for the mesh-launch --role all "
              "this spawns (ignored with --url); the batches get a fresh state directory.")  # fmt: skip
@click.option("--url", default=None, help="A running mesh's /v1 base instead of spawning one.")
@click.option("--model", default=None, help="The model's name (default: the first served).")
@click.option("--corpus", type=click.Path(exists=True, dir_okay=False), default=str(DEFAULT_CORPUS))  # fmt: skip
@click.option("--copies", type=click.IntRange(min=1), default=40, help="The corpus, this many times.")  # fmt: skip
@click.option("--ways", default=",".join(WAYS), help="A comma list of direct, batch, openai.")
@click.option("--openai-concurrency", type=click.IntRange(min=1), default=4)
@click.option("--openai-batch-size", type=click.IntRange(min=1), default=64)
@click.option("--live-rate", type=click.FloatRange(min=0.1), default=4.0,
              help="Live queries a second at most, each waiting for its answer.")  # fmt: skip
@click.option("--idle-seconds", type=click.FloatRange(min=1), default=10.0,
              help="How long live queries are measured alone first.")  # fmt: skip
@click.option("--poll-interval", type=click.FloatRange(min=0.05), default=0.5,
              help="mesh-embed --batch's longest wait between two looks at its batches.")  # fmt: skip
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(**o: Any) -> None:
    """Index the corpus x --copies with mesh-embed (direct and --batch) and a plain loop of
    openai-client calls: tokens/s each, and live query p50/p99 while each runs vs idle."""
    o["ways"] = [w.strip() for w in o["ways"].split(",") if w.strip()]
    if unknown := set(o["ways"]) - set(WAYS):
        raise click.UsageError(f"unknown ways: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="embedmesh-index-") as tmp:
        work = Path(tmp)
        if o["url"]:
            report = measure(o, o["url"], work)
        else:
            flags = o["spawn_args"]
            if "batch" in o["ways"] and "--state-dir" not in flags:
                flags += f" --state-dir {shlex.quote(str(work / 'state'))}"
            with SpawnedMesh(flags) as mesh:
                report = measure(o, mesh.url, work)
                report["mesh"] = mesh.describe()
    text = json.dumps(report, indent=2)
    if o["json_out"]:
        Path(o["json_out"]).write_text(text + "\n")
    print(text)

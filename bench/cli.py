"""``mesh-bench``: load the REST bridge from a corpus; report against sentence-transformers.

    mesh-bench --url http://127.0.0.1:8000/v1 --mode closed --concurrency 16 --duration 30
    mesh-bench --spawn '--workers 1 --threads 2' --spawn '--workers 2 --threads 1' \\
               --mode closed --mode latency --json out.json

Order within one invocation: the baseline first, alone (a separate process, finished before
any mesh starts); then, per mesh configuration, the modes one after the other. With
``--spawn`` each configuration is started by ``mesh-launch --role all`` (``--auto-truncate``
on, as sentence-transformers truncates too) and stopped before the next. With ``--url`` the
mesh must run with ``--auto-truncate`` or the corpus's long passages come back as 422.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click

from bench import breakdown
from bench.baseline import DEFAULT_BATCH_SIZES, DEFAULT_ENGINE_BUDGETS, run_in_subprocess
from bench.corpus import DEFAULT_CORPUS, load_texts, request_bodies
from bench.host import CpuUse, CpuWatch, wait_quiet
from bench.load import Target, closed_loop, open_loop, sequential
from bench.report import Report, Run, noise
from bench.spawn import SpawnedMesh
from bench.stats import Sample, summarize

LATENCY_WARMUP_REQUESTS = 20


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class Window:
    """What is watched while a window is measured: CPU by role, the ingress's histograms."""

    def __init__(self, target: Target, own_mesh: bool) -> None:
        self.target = target
        self.own_mesh = own_mesh
        self.watch = CpuWatch()
        self.before: breakdown.Scrape = {}

    def open(self) -> None:
        self.before = breakdown.scrape(self.target.url, self.target.api_key)
        self.watch.start()

    def close(self) -> tuple[CpuUse | None, dict[str, float]]:
        # With --url the mesh is not our child: its CPU would count as others'.
        cpu = self.watch.stop() if self.own_mesh else None
        after = breakdown.scrape(self.target.url, self.target.api_key)
        return cpu, breakdown.mean_ms(self.before, after)


def _measure(
    mode: str, target: Target, o: dict[str, Any], window: Window
) -> tuple[str, list[Sample], float]:
    """One mode, warm-up first (``window`` opens after it); returns its load label, samples
    and elapsed seconds."""
    amount = {"count": o["requests"]} if o["requests"] else {"duration_s": o["duration"]}
    if mode == "latency":
        queries = load_texts(o["corpus"], kind="query")
        bodies = request_bodies(queries, o["model_name"], 1, o["encoding_format"])
        samples, elapsed = _run(
            sequential(
                target,
                bodies,
                o["latency_requests"],
                warmup=LATENCY_WARMUP_REQUESTS,
                on_window=window.open,
            )
        )
        return "sequential, 1 query", samples, elapsed
    texts = load_texts(o["corpus"])
    tpr = o["texts_per_request"]
    bodies = request_bodies(texts, o["model_name"], tpr, o["encoding_format"])
    timing = {**amount, "warmup_s": o["warmup"], "on_window": window.open}
    if mode == "closed":
        conc = o["concurrency"]
        samples, elapsed = _run(closed_loop(target, bodies, conc, **timing))
        return f"{conc} clients x{tpr}", samples, elapsed
    rate = o["rate"]
    if not rate:
        raise click.UsageError("--mode open needs --rate")
    samples, elapsed = _run(open_loop(target, bodies, rate, seed=o["seed"], **timing))
    return f"{rate:g}/s Poisson x{tpr}", samples, elapsed


def _wait_quiet(max_wait_s: float) -> None:
    if max_wait_s <= 0:
        return
    click.echo(f"waiting up to {max_wait_s:.0f}s for the host to go quiet ...", err=True)
    share = wait_quiet(max_wait_s)
    if not share < 0.15:
        click.echo(f"  still {share:.0%} busy; measuring anyway", err=True)


def _baseline(report: Report, o: dict[str, Any]) -> None:
    click.echo("baseline: sentence-transformers encode in-process ...", err=True)
    sizes = tuple(int(b) for b in o["baseline_batch_sizes"].split(","))
    _wait_quiet(o["wait_quiet"])
    for attempt in range(1, o["retry_noisy"] + 2):
        watch = CpuWatch()
        watch.start()
        budgets = tuple(int(b) for b in o["engine_budgets"].split(",") if b)
        report.baseline = run_in_subprocess(
            o["corpus"], o["baseline_texts"], sizes, o["baseline_threads"], budgets
        )
        report.baseline_cpu = watch.stop()
        why = noise(report.baseline_cpu)
        if not why or attempt > o["retry_noisy"]:
            break
        click.echo(f"  baseline: {why}; measuring again", err=True)
        _wait_quiet(max(o["wait_quiet"], 60.0))
    best = report.baseline.best
    click.echo(f"  best: batch {best['batch_size']}, {best['tokens_per_s']:.0f} tok/s", err=True)


def _measure_run(label: str, mode: str, target: Target, o: dict[str, Any], own_mesh: bool) -> Run:
    """One mode's window; measured again (up to --retry-noisy times) while others skew it."""
    for attempt in range(1, o["retry_noisy"] + 2):
        window = Window(target, own_mesh)
        load, samples, elapsed = _measure(mode, target, o, window)
        cpu, stages = window.close()
        run = Run(label, mode, load, summarize(samples, elapsed), cpu, stages, attempt)
        why = noise(cpu)
        if not why or attempt > o["retry_noisy"]:
            return run
        click.echo(f"  {label} {mode}: {why}; measuring again", err=True)
        _wait_quiet(max(o["wait_quiet"], 60.0))
    raise AssertionError("unreachable")


def _bench_config(report: Report, spawn_args: str | None, o: dict[str, Any]) -> None:
    mesh = None
    if spawn_args is not None:
        _wait_quiet(o["wait_quiet"])
        mesh = SpawnedMesh(spawn_args)
        click.echo(f"starting mesh-launch --role all {spawn_args}".rstrip(), err=True)
        url = mesh.start()
        click.echo(mesh.line, err=True)
        label = spawn_args or "(defaults)"
    else:
        url, label = o["url"], o["url"]
    target = Target(url, o["api_key"], o["timeout"])
    try:
        for mode in o["mode"]:
            run = _measure_run(label, mode, target, o, own_mesh=mesh is not None)
            report.runs.append(run)
            s = run.stats
            click.echo(
                f"  {label} {mode} {run.load}: {s.requests_per_s:.1f} req/s, "
                f"{s.tokens_per_s:.0f} tok/s, p50 {s.latency_ms['p50']:.1f} ms, "
                f"errors {s.errors or 'none'}",
                err=True,
            )
    finally:
        if mesh is not None:
            mesh.stop()


@click.command(context_settings={"show_default": True})
@click.option("--url", default="http://127.0.0.1:8000/v1", help="The REST bridge's /v1 URL.")
@click.option(
    "--spawn",
    multiple=True,
    metavar="MESH_LAUNCH_ARGS",
    help="Start a mesh with 'mesh-launch --role all MESH_LAUNCH_ARGS' (e.g. "
    "'--workers 2 --threads 1'; '' for defaults) instead of using --url; "
    "repeat to compare configurations, each run alone.",
)
@click.option(
    "--mode",
    multiple=True,
    default=["closed"],
    type=click.Choice(["closed", "open", "latency"]),
    help="closed: N clients back to back; open: Poisson arrivals at --rate; "
    "latency: one short query at a time. Repeatable.",
)
@click.option(
    "--corpus",
    default=str(DEFAULT_CORPUS),
    type=click.Path(exists=True, dir_okay=False),
    help="JSON lines with a 'text' field (and 'kind': query|passage).",
)
@click.option("--model-name", default="all-MiniLM-L6-v2", help="'model' in each request.")
@click.option("--concurrency", default=16, help="[closed] Concurrent clients.")
@click.option("--rate", type=float, help="[open] Requests per second.")
@click.option("--texts-per-request", default=1, help="[closed, open] Inputs per request.")
@click.option("--duration", default=30.0, help="[closed, open] Seconds measured.")
@click.option(
    "--requests", type=int, help="[closed, open] Requests measured instead of --duration."
)
@click.option(
    "--warmup",
    default=5.0,
    help="[closed, open] Seconds of the same load, unbroken, before the measured window.",
)
@click.option("--latency-requests", default=300, help="[latency] Queries measured.")
@click.option("--encoding-format", default="float", type=click.Choice(["float", "base64"]))
@click.option(
    "--baseline/--no-baseline",
    default=True,
    help="Measure sentence-transformers encode in-process first.",
)
@click.option("--baseline-texts", default=1000, help="Corpus texts the baseline encodes.")
@click.option(
    "--baseline-batch-sizes",
    default=",".join(map(str, DEFAULT_BATCH_SIZES)),
    help="Batch sizes tried; the best counts.",
)
@click.option(
    "--engine-budgets",
    default=",".join(map(str, DEFAULT_ENGINE_BUDGETS)),
    help="After the baseline, in the same process: our engine alone on the same texts in "
    "FCFS batches of these token budgets (what the mesh costs on top); '' to skip.",
)
@click.option("--baseline-threads", type=int, help="torch threads (default: every core).")
@click.option("--api-key", help="Bearer key, if the ingress wants one.")
@click.option("--timeout", default=120.0, help="Seconds per request before it counts as failed.")
@click.option(
    "--wait-quiet",
    default=0.0,
    help="Before the baseline and each spawned mesh, wait up to this many seconds for the "
    "host to be under 15% busy (a shared machine skews every number).",
)
@click.option(
    "--retry-noisy",
    default=0,
    help="Measure a window again, up to this many times, when other processes took over 5% "
    "of the CPUs or the hypervisor stole over 10% meanwhile.",
)
@click.option("--seed", default=0, help="Seed of the Poisson schedule.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report as JSON here.",
)
def main(**o: Any) -> None:
    """Benchmark an embedmesh REST bridge (see the module docstring for the run order)."""
    report = Report(
        args={k: (list(v) if isinstance(v, tuple) else v) for k, v in o.items() if k != "api_key"}
        | {"json_path": str(o["json_path"])}
    )
    if o["baseline"]:
        _baseline(report, o)
    for spawn_args in o["spawn"] or [None]:
        _bench_config(report, spawn_args, o)
    click.echo(report.table())
    if o["json_path"]:
        o["json_path"].write_bytes(report.as_json())
    sys.stdout.flush()


if __name__ == "__main__":
    main()

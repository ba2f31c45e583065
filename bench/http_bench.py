"""``mesh-bench http`` (the default command): load the REST bridge from a corpus; report
against sentence-transformers.

    mesh-bench --url http://127.0.0.1:8000/v1 --mode closed --concurrency 16 --duration 30
    mesh-bench --spawn '--workers 1 --threads 2' --spawn '--workers 2 --threads 1' \\
               --mode closed --mode latency --json out.json
    mesh-bench --spawn '--ingress-procs 6' --procs 4 --mode closed --concurrency 64
    mesh-bench --spawn '' --mode mixed --concurrency 32 --live-rate 10 --duration 30
    mesh-bench --spawn '' --mode hops --latency-requests 300 --no-baseline

Order within one invocation: the baseline first, alone (a separate process, finished before
any mesh starts); then, per mesh configuration, the modes one after the other (``mixed``:
bulk alone, then bulk with live queries, each window as long). With ``--spawn`` each
configuration is started by ``mesh-launch --role all`` (``--auto-truncate`` on, as
sentence-transformers truncates too; the rest of the flags passed unchanged) and stopped
before the next. With ``--url`` the mesh must run with ``--auto-truncate`` or the corpus's
long passages come back as 422. ``--json`` writes the report, and PNG plots beside it (or in
``--plot-dir``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click
import orjson

from bench import breakdown, hops, procs
from bench.baseline import DEFAULT_BATCH_SIZES, DEFAULT_ENGINE_BUDGETS, run_in_subprocess
from bench.corpus import DEFAULT_CORPUS, PRIORITIES, load_texts, request_bodies
from bench.host import CpuUse, CpuWatch, wait_quiet
from bench.load import Measured, Target, sequential
from bench.modes import BULK, BULK_ALONE, WIRE_LANES, Workload, phases
from bench.report import Report, Run, hops_lines, noise
from bench.spawn import SpawnedMesh
from bench.stats import cdf_ms, hops_summary, summarize, timeline

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
        self.after: breakdown.Scrape = {}
        self.cpu: CpuUse | None = None
        self.closed = False

    def open(self) -> None:
        self.before = breakdown.scrape(self.target.url, self.target.api_key)
        self.watch.start()

    def close(self) -> None:
        """Read what was used and seen since ``open``; once (later calls keep that)."""
        if not self.closed:
            # With --url the mesh is not our child: its CPU would count as others'.
            self.cpu = self.watch.stop() if self.own_mesh else None
            self.after = breakdown.scrape(self.target.url, self.target.api_key)
            self.closed = True

    def stages(self, lane: str | None = None) -> dict[str, float]:
        """Mean ms per request by stage over the window (of one wire lane, if given)."""
        return breakdown.mean_ms(self.before, self.after, lane)


def _latency(target: Target, o: dict[str, Any], work: Workload, window: Window) -> Measured:
    bodies = request_bodies(work.queries, o["model_name"], 1, o["encoding_format"], _prio(o))
    return _run(
        sequential(
            target,
            bodies,
            o["latency_requests"],
            warmup=LATENCY_WARMUP_REQUESTS,
            on_window=window.open,
        )
    )


def _prio(o: dict[str, Any]) -> str | None:
    return None if o["priority"] == "auto" else o["priority"]


def _runs_of(
    label: str, mode: str, loads: dict[str, str], lanes: dict[str, Measured], window: Window
) -> list[Run]:
    """One Run per lane of a measured window, all with that window's CPU; the ingress's
    stages of the lane's own traffic when the window has several lanes."""
    window.close()
    runs = []
    for lane, m in lanes.items():
        # An empty window (nothing came back, by count) is still a row: rates 0, its errors.
        elapsed = max(m.elapsed_s, 1e-9)
        latencies = [s.latency_s * 1000 for s in m.samples if s.ok]
        runs.append(
            Run(
                label, mode, loads.get(lane, ""), summarize(m.samples, elapsed), window.cpu,
                window.stages(WIRE_LANES.get(lane) if len(lanes) > 1 else None),
                lane=lane, cdf_ms=cdf_ms(latencies), timeline=timeline(m.samples, m.start_s, elapsed),
                hops_ms=hops_summary(m.samples),
            )
        )  # fmt: skip
    return runs


def _measure(
    label: str, mode: str, target: Target, o: dict[str, Any], work: Workload, own_mesh: bool
) -> list[Run]:
    """One mode's windows (``mixed`` has two), warm-up first in each."""
    if mode == "latency":
        window = Window(target, own_mesh)
        m = _latency(target, o, work, window)
        return _runs_of(label, mode, {"": "sequential, 1 query"}, {"": m}, window)
    runs: list[Run] = []
    try:
        planned = phases(mode, work, o)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    for phase in planned:
        window = Window(target, own_mesh)
        lanes = procs.run(
            target, phase.per_process, phase.timing, window.open,
            spawn=phase.spawn, on_done=window.close,
        )  # fmt: skip
        runs += _runs_of(label, mode, phase.loads, lanes, window)
    alone = next((r for r in runs if r.lane == BULK_ALONE), None)
    for r in runs:
        if alone is not None and r.lane == BULK and alone.stats.tokens_per_s > 0:
            r.vs_alone = r.stats.tokens_per_s / alone.stats.tokens_per_s
    return runs


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


def _measure_runs(
    label: str, mode: str, target: Target, o: dict[str, Any], own_mesh: bool
) -> list[Run]:
    """One mode's windows; measured again (up to --retry-noisy times) while others skew one."""
    work = Workload(load_texts(o["corpus"]), load_texts(o["corpus"], kind="query"))
    for attempt in range(1, o["retry_noisy"] + 2):
        runs = _measure(label, mode, target, o, work, own_mesh)
        why = next((w for r in runs if (w := noise(r.cpu))), "")
        for r in runs:
            r.attempts = attempt
        if not why or attempt > o["retry_noisy"]:
            return runs
        click.echo(f"  {label} {mode}: {why}; measuring again", err=True)
        _wait_quiet(max(o["wait_quiet"], 60.0))
    raise AssertionError("unreachable")


def _bench_config(report: Report, spawn_args: str | None, o: dict[str, Any]) -> None:
    mesh = None
    if spawn_args is not None:
        _wait_quiet(o["wait_quiet"])
        mesh = SpawnedMesh(spawn_args)
        # The flags go to mesh-launch unchanged (shlex-split), after the bench's own.
        click.echo(f"starting mesh-launch --role all {spawn_args}".rstrip(), err=True)
        url = mesh.start()
        click.echo(mesh.line, err=True)
        label = spawn_args or "(defaults)"
        report.configs[label] = mesh.describe()
    else:
        url, label = o["url"], o["url"]
        report.configs[label] = f"an external mesh at {url}"
    target = Target(url, o["api_key"], o["timeout"])
    try:
        for mode in o["mode"]:
            if mode == "hops":
                report.hops.append(_hops(label, spawn_args, mesh, target, o))
                for line in hops_lines(report.hops[-1]):
                    click.echo(line, err=True)
                continue
            for run in _measure_runs(label, mode, target, o, own_mesh=mesh is not None):
                report.runs.append(run)
                s = run.stats
                click.echo(
                    f"  {label} {run.name} {run.load}: {s.requests_per_s:.1f} req/s, "
                    f"{s.tokens_per_s:.0f} tok/s, p50 {s.latency_ms['p50']:.1f} ms, "
                    f"errors {s.errors or 'none'}",
                    err=True,
                )
    finally:
        if mesh is not None:
            mesh.stop()


def _hops(
    label: str, spawn_args: str | None, mesh: SpawnedMesh | None, target: Target, o: dict[str, Any]
) -> dict[str, Any]:
    """``--mode hops``: the same query through the engine alone, MeshClient, HTTP and a
    bare HTTP server (the HTTP stack's floor)."""
    model_dir, device = hops.engine_from_spawn(spawn_args or "")
    setup = hops.Setup(
        query=o["hops_query"],
        count=o["latency_requests"],
        warmup=LATENCY_WARMUP_REQUESTS,
        model_name=o["model_name"],
        engine_model=o["engine_model"] or model_dir,
        engine_device=o["engine_device"] or device,
        broker=o["broker"] or (mesh.broker_frontend() if mesh is not None else None),
    )
    return hops.measure(label, target, setup, lambda what: click.echo(f"  {what}", err=True))


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
    type=click.Choice(["closed", "open", "latency", "mixed", "hops"]),
    help="closed: N clients back to back; open: Poisson arrivals at --rate; "
    "latency: one short query at a time; mixed: bulk on the batch lane alone, then bulk plus "
    "live queries at --live-rate on the interactive lane; hops: one query's time per hop, "
    "engine alone vs MeshClient vs HTTP vs a bare HTTP server. Repeatable.",
)
@click.option(
    "--procs",
    default=1,
    help="[closed, open, mixed] Load processes sharing the clients (or the rate); their "
    "results are merged over one window. Raise it when the load generator is the limit.",
)
@click.option(
    "--corpus",
    default=str(DEFAULT_CORPUS),
    type=click.Path(exists=True, dir_okay=False),
    help="JSON lines with a 'text' field (and 'kind': query|passage).",
)
@click.option("--model-name", default="all-MiniLM-L6-v2", help="'model' in each request.")
@click.option("--concurrency", default=16, help="[closed, mixed bulk] Concurrent clients.")
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
@click.option("--latency-requests", default=300, help="[latency, hops] Queries measured.")
@click.option(
    "--live-rate",
    type=float,
    multiple=True,
    default=(10.0,),
    help="[mixed] Live queries per second, evenly spaced; repeat for a window per rate "
    "(e.g. 0.2, 1, 5, 20: give a sparse rate a --duration that holds enough queries).",
)
@click.option("--bulk-texts-per-request", default=64, help="[mixed] Inputs per bulk request.")
@click.option(
    "--priority",
    default="auto",
    type=click.Choice(["auto", *PRIORITIES]),
    help="[closed, open, latency] The lane each request asks for ('priority' body field); "
    "auto: none, the ingress picks by size. mixed always names both lanes.",
)
@click.option(
    "--broker",
    help="[hops] Broker frontend for the MeshClient way with --url (found by itself with --spawn).",
)
@click.option("--hops-query", default=hops.DEFAULT_QUERY, help="[hops] The query sent.")
@click.option(
    "--engine-model",
    help="[hops] Model directory of the engine-alone way (default: --spawn's --model, "
    "else the embedded model).",
)
@click.option(
    "--engine-device", help="[hops] Device of the engine-alone way (default: --spawn's, or cpu)."
)
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
    help="Also write the report as JSON here (and PNG plots beside it).",
)
@click.option(
    "--plot-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write PNG plots here (latency CDF per lane, throughput over time); default: the "
    "--json file's folder.",
)
def main(**o: Any) -> None:
    """Benchmark an embedmesh REST bridge through HTTP, from separate load processes.

    Order: the sentence-transformers baseline first, alone (unless --no-baseline); then, per
    mesh configuration (--url, or each --spawn started and stopped in turn), the --mode runs
    one after the other. Modes, flags and how each number is formed: bench/README.md.
    """
    report = Report(
        args={k: (list(v) if isinstance(v, tuple) else v) for k, v in o.items() if k != "api_key"}
        | {"json_path": str(o["json_path"]), "plot_dir": str(o["plot_dir"])}
    )
    if o["baseline"]:
        _baseline(report, o)
    for spawn_args in o["spawn"] or [None]:
        _bench_config(report, spawn_args, o)
    click.echo(report.table())
    if o["json_path"]:
        o["json_path"].parent.mkdir(parents=True, exist_ok=True)  # not an hour's run lost to it
        o["json_path"].write_bytes(report.as_json())
    _plot(report, o)
    sys.stdout.flush()


def _plot(report: Report, o: dict[str, Any]) -> None:
    folder = o["plot_dir"] or (o["json_path"].parent if o["json_path"] else None)
    if folder is None:
        return
    try:
        from bench.plots import write_plots
    except ImportError as exc:  # matplotlib is in the test extra, not a serving dependency
        click.echo(f"no plots: {exc} (pip install matplotlib)", err=True)
        return
    stem = o["json_path"].stem if o["json_path"] else "mesh-bench"
    for path in write_plots(orjson.loads(report.as_json()), Path(folder), stem):
        click.echo(f"plot: {path}", err=True)


if __name__ == "__main__":
    main()

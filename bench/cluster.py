"""``mesh-bench cluster``: a mesh laid out on hosts by a topology file, loaded from every load
host by one coordinator; per-role figures from ``/metrics``; JSON and PNG plots.

    mesh-bench cluster --topology bench/topologies/workers-2.toml --json out/cluster.json
    mesh-bench cluster --topology bench/topologies/workers-1.toml \\
        --topology bench/topologies/workers-2.toml --topology bench/topologies/workers-4.toml \\
        --engine null --engine real --json out/workers.json          # a sweep: one row each
    mesh-bench cluster --topology bench/topologies/hop-split.toml --delay-ms 0 --delay-ms 2 \\
        --delay-ms 20 --json out/hop.json

Each row (a topology, with each ``--engine`` and each ``--delay-ms`` given) is started,
loaded and torn down before the next, processes and namespaces, also on an error or Ctrl-C.
The file format and the ssh way: bench/README.md ("cluster").
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from bench import topology
from bench.cluster_run import ClusterRun


def rows(topos: list[topology.Topology], engines: tuple[str, ...],
         delays: tuple[float, ...]) -> list[tuple[str, topology.Topology]]:  # fmt: skip
    """(label, topology) of every row of a sweep, in order: topology, engine, delay (a
    topology without links has no delay to set: one row for all of them)."""
    out = []
    for topo in topos:
        settable = delays if topo.links else ()
        for engine, delay in itertools.product(engines or (None,), settable or (None,)):
            label = topo.name
            if engine is not None:
                label += f" engine={engine}"
            if delay is not None:
                label += f" delay={delay:g}ms"
            out.append((label, topo.with_overrides(engine=engine, delay_ms=delay)))
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'config':<44} {'tok/s':>10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  errors"]
    for r in results:
        for lane, row in r["lanes"].items():
            s = row["stats"]
            name = r["config"] + ("" if lane == "load" else f" [{lane}]")
            lines.append(
                f"{name:<44} {s['tokens_per_s']:>10.0f} {s['requests_per_s']:>8.1f} "
                f"{s['latency_ms'].get('p50', 0):>8.1f} {s['latency_ms'].get('p99', 0):>8.1f}  "
                f"{s['errors'] or 'none'}"
            )
    return "\n".join(lines)


def _stop_on_sigterm() -> None:
    # SIGTERM tears down as Ctrl-C does: the finally blocks stop every process.
    def handler(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@click.command("cluster", context_settings={"show_default": True})
@click.option(
    "--topology",
    "topologies",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML topology file (bench/topologies/ has examples); repeat for a sweep.",
)
@click.option(
    "--engine",
    "engines",
    multiple=True,
    type=click.Choice(topology.ENGINES),
    help="Run every worker on this engine (null: bench.null_worker, no compute); "
    "repeat for a row each. Default: as each file says.",
)
@click.option(
    "--delay-ms",
    "delays",
    multiple=True,
    type=float,
    help="Set every [[links]] delay of the files to this (ms each way); repeat for "
    "a row each. Default: as each file says.",
)
@click.option("--duration", type=float, help="Seconds measured (default: [load] duration_s).")
@click.option("--warmup", type=float, help="Seconds of warm-up (default: [load] warmup_s).")
@click.option(
    "--logs",
    type=click.Path(file_okay=False, path_type=Path),
    help="Role and load process logs, a folder per row (default: a temp folder).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the rows as JSON here (and PNG plots beside it).",
)
@click.option("--plot-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write PNG plots here (default: the --json file's folder).")  # fmt: skip
def main(topologies: tuple[Path, ...], engines: tuple[str, ...], delays: tuple[float, ...],
         duration: float | None, warmup: float | None, logs: Path | None,
         json_path: Path | None, plot_dir: Path | None) -> None:  # fmt: skip
    """Start a mesh across hosts from a topology file, load it from every load host, read
    each role's figures from /metrics, tear it all down; one row per topology (and per
    --engine and --delay-ms given)."""
    _stop_on_sigterm()
    try:
        topos = [_with_window(topology.load(p), duration, warmup) for p in topologies]
        planned = rows(topos, engines, delays)
    except topology.TopologyError as exc:
        raise click.UsageError(str(exc)) from None
    results = []
    for i, (label, topo) in enumerate(planned):
        click.echo(f"[{i + 1}/{len(planned)}] {label}: starting {len(topo.hosts)} hosts", err=True)
        run = ClusterRun(topo, logs / f"row-{i + 1}" if logs else None, label)
        try:
            results.append(run.run())
        except RuntimeError as exc:
            raise click.ClickException(f"{label}: {exc}") from None
        s = next(iter(results[-1]["lanes"].values()))["stats"]
        click.echo(f"  {s['tokens_per_s']:.0f} tok/s, {s['requests_per_s']:.1f} req/s, "
                   f"errors {s['errors'] or 'none'}", err=True)  # fmt: skip
    click.echo(table(results))
    report = {"rows": results}
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1))
    folder = plot_dir or (json_path.parent if json_path else None)
    if folder is not None:
        _plot(report, folder, json_path.stem if json_path else "cluster")
    sys.stdout.flush()


def _with_window(topo: topology.Topology, duration: float | None,
                 warmup: float | None) -> topology.Topology:  # fmt: skip
    load = topo.load
    if duration is not None:
        load = dataclasses.replace(load, duration_s=duration)
    if warmup is not None:
        load = dataclasses.replace(load, warmup_s=warmup)
    return dataclasses.replace(topo, load=load)


def _plot(report: dict[str, Any], folder: Path, stem: str) -> None:
    try:
        from bench.cluster_plots import write_plots
    except ImportError as exc:  # matplotlib is in the test extra, not a serving dependency
        click.echo(f"no plots: {exc} (pip install matplotlib)", err=True)
        return
    for path in write_plots(report, folder, stem):
        click.echo(f"plot: {path}", err=True)

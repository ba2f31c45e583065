"""PNG plots of a mesh-bench report: latency CDF per lane, throughput over time.

Drawn from the report's JSON (``cdf_ms`` and ``timeline`` of each run), so a saved report can
be drawn again later: ``mesh-bench plots report.json [folder]``. matplotlib with the Agg
backend (no display); it is in the ``test`` extra, not a serving dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: a headless benchmark host has no display

import matplotlib.pyplot as plt  # noqa: E402

Run = dict[str, Any]  # one entry of the report JSON's "runs"


def lane_of(run: Run) -> str:
    """The plot a run's latency belongs in: its mode, and its lane when the mode has several."""
    return f"{run['mode']} {run['lane']}" if run.get("lane") else run["mode"]


def _label(run: Run, with_lane: bool) -> str:
    return f"{run['config']} | {lane_of(run)}" if with_lane else str(run["config"])


def latency_cdf(runs: Sequence[Run], path: Path) -> Path | None:
    """One panel per lane, one line per configuration; log-scaled milliseconds."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run.get("cdf_ms"):
            groups.setdefault(lane_of(run), []).append(run)
    if not groups:
        return None
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for ax, (lane, members) in zip(axes.flat, groups.items(), strict=False):
        for run in members:
            xs = run["cdf_ms"]
            ys = [i / (len(xs) - 1) if len(xs) > 1 else 1.0 for i in range(len(xs))]
            ax.plot(xs, ys, label=_label(run, False))
        ax.set_xscale("log")
        ax.set_title(f"latency CDF: {lane}")
        ax.set_xlabel("ms (log)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=7)
    return _save(fig, path)


def throughput(runs: Sequence[Run], path: Path) -> Path | None:
    """Tokens/s per time bin of each throughput run (the live lane and latency runs left out)."""
    shown = [
        r
        for r in runs
        if r.get("timeline", {}).get("tokens_per_s")
        and r["mode"] not in ("latency", "hops")
        and r.get("lane") != "live"
    ]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for run in shown:
        t = run["timeline"]
        xs = [(i + 0.5) * t["bin_s"] for i in range(len(t["tokens_per_s"]))]
        ax.plot(xs, t["tokens_per_s"], marker=".", label=_label(run, True))
    ax.set_title("throughput over the measured window")
    ax.set_xlabel("s into the window")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def hop_bars(hops: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """``--mode hops``: per configuration, each way's p50 and each hop's p50."""
    if not hops:
        return None
    fig, axes = plt.subplots(len(hops), 1, figsize=(8, 0.5 + 3.5 * len(hops)), squeeze=False)
    for ax, h in zip(axes[:, 0], hops, strict=True):
        names, values = [], []
        for way, w in h["ways"].items():
            if w.get("skipped"):
                continue
            names.append(f"{way} (whole)")
            values.append(w["p50_ms"] or 0.0)  # null in JSON: no query came back
            for hop, ms in w["hops_p50_ms"].items():
                names.append(f"  {way}: {hop}")
                values.append(ms)
        ax.barh(names[::-1], values[::-1])
        ax.set_title(f"one query, p50 per way and per hop: {h['config']}")
        ax.set_xlabel("ms")
        ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(report: dict[str, Any], folder: Path, stem: str = "mesh-bench") -> list[Path]:
    """Every plot the report has data for, as ``folder/stem-*.png``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    runs = report.get("runs", [])
    made = [
        latency_cdf(runs, folder / f"{stem}-latency-cdf.png"),
        throughput(runs, folder / f"{stem}-throughput.png"),
        hop_bars(report.get("hops", []), folder / f"{stem}-hops.png"),
    ]
    return [p for p in made if p is not None]


def main(argv: list[str] | None = None) -> None:
    """``mesh-bench plots REPORT.json [FOLDER]``: the plots of a saved report."""
    import argparse

    import orjson

    parser = argparse.ArgumentParser(
        prog="mesh-bench plots", description="PNG plots of a saved mesh-bench http --json report."
    )
    parser.add_argument("report", type=Path, help="the report's JSON")
    parser.add_argument("folder", type=Path, nargs="?", help="where (default: beside it)")
    args = parser.parse_args(argv)
    src: Path = args.report
    for path in write_plots(orjson.loads(src.read_bytes()), args.folder or src.parent, src.stem):
        print(path)


if __name__ == "__main__":
    main()

"""PNG plots of a ``mesh-bench cluster`` report: tokens/s per row (a sweep's bars), and through
bench/plots.py the latency CDF and the throughput over each row's window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import plots


def as_runs(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row's lanes in the shape bench/plots.py draws (an http report's runs)."""
    return [
        {"config": row["config"], "mode": "cluster", "lane": "" if lane == "load" else lane,
         "cdf_ms": data["cdf_ms"], "timeline": data["timeline"]}
        for row in report.get("rows", []) for lane, data in row["lanes"].items()
    ]  # fmt: skip


def throughput_bars(report: dict[str, Any], path: Path) -> Path | None:
    """One bar per row: tokens/s over its measured window."""
    rows = [(r["config"], lane, d["stats"]["tokens_per_s"])
            for r in report.get("rows", []) for lane, d in r["lanes"].items()]  # fmt: skip
    if not rows:
        return None
    fig, ax = plots.plt.subplots(figsize=(8, 0.8 + 0.45 * len(rows)))
    names = [c if lane == "load" else f"{c} [{lane}]" for c, lane, _ in rows]
    ax.barh(names[::-1], [v for *_, v in rows][::-1])
    ax.set_xlabel("tokens/s")
    ax.set_title("throughput per configuration")
    ax.grid(True, axis="x", alpha=0.3)
    return plots._save(fig, path)


def write_plots(report: dict[str, Any], folder: Path, stem: str = "cluster") -> list[Path]:
    """Every plot the report has data for, as ``folder/stem-*.png``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    runs = as_runs(report)
    made = [
        throughput_bars(report, folder / f"{stem}-tokens-per-s.png"),
        plots.latency_cdf(runs, folder / f"{stem}-latency-cdf.png"),
        plots.throughput(runs, folder / f"{stem}-throughput.png"),
    ]
    return [p for p in made if p is not None]

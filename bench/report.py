"""Reports: the machine, one row per run, the baseline and the ratio; a table and JSON."""

from __future__ import annotations

import datetime
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.baseline import BaselineResult
from bench.host import CpuUse
from bench.stats import RunStats

NOISY_OTHER_CPU = 0.05  # others' CPU share past which a run's numbers get a warning
NOISY_STEAL = 0.10  # likewise for the hypervisor's steal (other guests on the same host)


def machine() -> dict[str, Any]:
    """nproc, CPU model and RAM of this host, as the benchmark page records them."""
    cpu = platform.processor() or platform.machine()
    mem_gib = math.nan
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # Load average at the start: on a shared 2-core host, other work skews every number.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    return {
        "nproc": nproc,
        "cpu": cpu,
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "loadavg_1m": round(load, 2),
    }


@dataclass
class Run:
    """One load run against one mesh configuration."""

    config: str  # how the mesh was started ("--workers 2 --threads 1", or the URL)
    mode: str  # closed | open | latency | mixed
    load: str  # "16 clients x1", "50/s Poisson x1", "sequential, 1 query"
    stats: RunStats
    cpu: CpuUse | None = None  # CPU by role, and others' share meanwhile (None: not measured)
    stages_ms: dict[str, float] = field(default_factory=dict)  # mean ms per request, by stage
    attempts: int = 1  # windows measured; earlier ones were discarded as noisy (--retry-noisy)
    lane: str = ""  # mixed: "bulk alone", "bulk" or "live"; "" for one-lane modes
    vs_alone: float | None = None  # mixed bulk: its tokens/s over the same run's bulk alone
    cdf_ms: list[float] = field(default_factory=list)  # latency at percentiles 0, 0.5, ..., 100
    timeline: dict[str, Any] = field(default_factory=dict)  # throughput over the window
    # {"p50": {hop: ms}, "p99": {hop: ms}} over the samples that asked for the ingress's
    # timings (mixed live), outside_ingress included; {} for a lane that did not ask.
    hops_ms: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The mode, and the lane where a mode has several."""
        return f"{self.mode} {self.lane}" if self.lane else self.mode

    @property
    def throughput(self) -> bool:
        """Whether its tokens/s mean a capacity (not a latency probe or the live lane)."""
        return self.mode not in ("latency", "hops") and self.lane != "live"

    @property
    def other_cpu(self) -> float | None:
        return self.cpu.others if self.cpu is not None else None


@dataclass
class Report:
    args: dict[str, Any]
    baseline: BaselineResult | None = None
    runs: list[Run] = field(default_factory=list)
    baseline_cpu: CpuUse | None = None
    configs: dict[str, str] = field(default_factory=dict)  # config label -> how it was started
    hops: list[dict[str, Any]] = field(default_factory=list)  # --mode hops, per configuration
    started: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    )
    host: dict[str, Any] = field(default_factory=machine)

    def ratio(self, run: Run) -> float:
        """Tokens/s against the best baseline; NaN for a latency run (not a throughput)."""
        if self.baseline is None or not run.throughput:
            return math.nan
        return run.stats.tokens_per_s / self.baseline.best["tokens_per_s"]

    def as_json(self) -> bytes:
        return orjson.dumps(
            {
                "started": self.started,
                "machine": self.host,
                "args": self.args,
                "baseline": self.baseline.as_dict() if self.baseline else None,
                "baseline_other_cpu": self.baseline_cpu.others if self.baseline_cpu else None,
                "baseline_steal": self.baseline_cpu.steal if self.baseline_cpu else None,
                "configs": self.configs,
                "hops": self.hops,
                "runs": [
                    {
                        "config": r.config,
                        "mode": r.mode,
                        "lane": r.lane,
                        "load": r.load,
                        "vs_baseline": self.ratio(r),
                        "vs_alone": r.vs_alone,
                        "cdf_ms": r.cdf_ms,
                        "timeline": r.timeline,
                        "hops_ms": r.hops_ms,
                        "other_cpu": r.other_cpu,
                        "steal": r.cpu.steal if r.cpu is not None else None,
                        "stages_ms": r.stages_ms,
                        "attempts": r.attempts,
                        "cpu_cores_by_role": r.cpu.ours if r.cpu is not None else None,
                        **r.stats.as_dict(),
                    }
                    for r in self.runs
                ],
            },
            option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY,
        )

    def table(self) -> str:
        h = self.host
        lines = [
            f"{self.started}  {h['nproc']} cpus ({h['cpu']}), {h['mem_gib']} GiB RAM, "
            f"load average {h['loadavg_1m']} at start"
        ]
        lines += [f"config {label!r}: {how}" for label, how in self.configs.items()]
        header = (
            "config mode load ok/sent req/s texts/s tok/s p50_ms p90_ms p99_ms vs_ST other_cpu "
            "steal"
        )
        rows = [[c.replace("_", " ") for c in header.split(" ")]]
        rows += [self._run_row(r) for r in self.runs]
        rows += self._baseline_rows()
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
        lines += [
            f"errors in {r.config} {r.name}: {r.stats.errors}" for r in self.runs if r.stats.errors
        ]
        lines += [
            f"cpu (cores) in {r.config} {r.name}: "
            + ", ".join(
                f"{role} {cores:.2f}"
                for role, cores in sorted(r.cpu.ours.items(), key=lambda x: -x[1])
            )
            for r in self.runs
            if r.cpu is not None and r.cpu.ours
        ]
        lines += [
            f"mean ms per request in {r.config} {r.name}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.stages_ms.items())
            for r in self.runs
            if r.stages_ms
        ]
        lines += [_mixed_line(r, self.runs) for r in self.runs if r.vs_alone is not None]
        lines += [run_hops_line(r) for r in self.runs if r.hops_ms]
        lines += [line for h in self.hops for line in hops_lines(h)]
        lines += [w for r in self.runs if (w := _noise_warning(r))]
        return "\n".join(lines)

    def _run_row(self, r: Run) -> list[str]:
        s, lat, ratio = r.stats, r.stats.latency_ms, self.ratio(r)
        return [
            r.config,
            r.name,
            r.load,
            f"{s.ok}/{s.requests}",
            f"{s.requests_per_s:.1f}",
            f"{s.texts_per_s:.1f}",
            f"{s.tokens_per_s:.0f}",
            f"{lat['p50']:.1f}",
            f"{lat['p90']:.1f}",
            f"{lat['p99']:.1f}",
            "" if math.isnan(ratio) else f"{ratio:.2f}x",
            _share(r.other_cpu),
            _share(r.cpu.steal if r.cpu is not None else None),
        ]

    def _baseline_rows(self) -> list[list[str]]:
        b = self.baseline
        if b is None:
            return []
        cpu = self.baseline_cpu
        other = [_share(cpu.others if cpu else None), _share(cpu.steal if cpu else None)]
        best = b.best["tokens_per_s"]
        rows = []
        for label, unit, results in (
            (f"sentence-transformers encode, {b.threads} threads", "batch", b.by_batch_size),
            (f"embedmesh engine alone, {b.threads} threads", "budget", b.engine_by_budget),
        ):
            for size, m in results.items():
                rows.append([
                    label, "in-process", f"{unit} {size}", f"{b.texts} texts", "",
                    f"{m['texts_per_s']:.1f}", f"{m['tokens_per_s']:.0f}", "", "", "",
                    f"{m['tokens_per_s'] / best:.2f}x", *other,
                ])  # fmt: skip
        return rows


def noise(cpu: CpuUse | None) -> str:
    """Why a window's numbers are skewed by others ("" when they are not, or not known)."""
    if cpu is None:
        return ""
    why = []
    if cpu.others > NOISY_OTHER_CPU:
        why.append(f"other processes took {cpu.others:.0%} of the CPUs")
    if cpu.steal > NOISY_STEAL:
        why.append(f"the hypervisor stole {cpu.steal:.0%}")
    return " and ".join(why)


def _noise_warning(r: Run) -> str:
    why = noise(r.cpu)
    return f"warning: during {r.config} {r.name} {why}" if why else ""


def _mixed_line(bulk: Run, runs: list[Run]) -> str:
    """A mixed run in one line: what the live lane saw, what the bulk kept of its solo rate.
    Its live run is the one of its own window (the first live run after it: with several
    --live-rate, each window has its own)."""
    after = runs[runs.index(bulk) + 1 :]
    live = next((r for r in after if r.config == bulk.config and r.lane == "live"), None)
    beside = f" beside live {live.load.split('/s')[0]}/s" if live is not None else ""
    line = (
        f"mixed in {bulk.config}{beside}: bulk {bulk.stats.tokens_per_s:.0f} tok/s = "
        f"{bulk.vs_alone:.2f}x of bulk alone"
    )
    if live is not None:
        lat = live.stats.latency_ms
        line += (
            f"; live p50/p90/p99 {lat['p50']:.1f}/{lat['p90']:.1f}/{lat['p99']:.1f} ms "
            f"({live.stats.ok}/{live.stats.requests} ok)"
        )
    return line


def run_hops_line(r: Run) -> str:
    """A lane's per-hop p50/p99 in one line, hops in the order the ingress reported them."""
    p50, p99 = r.hops_ms.get("p50", {}), r.hops_ms.get("p99", {})
    hops = ", ".join(f"{hop} {ms:.2f}/{p99.get(hop, math.nan):.2f}" for hop, ms in p50.items())
    return f"{r.lane or r.mode} hops in {r.config}, p50/p99 ms: {hops}"


def hops_lines(h: dict[str, Any]) -> list[str]:
    """``--mode hops`` of one configuration: p50 of each way, then each way's hops."""
    ways = h["ways"]
    lines = [
        f"hops in {h['config']} ({h['count']} x {h['query']!r}): "
        + ", ".join(
            f"{way} p50 {w['p50_ms']:.2f} ms" for way, w in ways.items() if not w.get("skipped")
        )
    ]
    for way, w in ways.items():
        if w.get("skipped"):
            lines.append(f"  {way}: skipped ({w['skipped']})")
        elif w["hops_p50_ms"]:
            hops = ", ".join(f"{k} {v:.3f}" for k, v in w["hops_p50_ms"].items())
            lines.append(f"  {way} per hop, p50 ms: {hops}")
    return lines


def _share(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.0%}"

"""``mesh-bench soak``: a whole mesh under moderate load for a long time, watched.

    mesh-bench soak --minutes 30 --out soak.json
    mesh-bench soak --minutes 0.5 --warmup 5 --sample-every 2 --out /tmp/soak.json

Starts ``mesh-launch --role all`` (CPU, the embedded all-MiniLM-L6-v2, as ``bench.spawn`` does
for ``mesh-bench``) and drives it from a separate process (``bench.harness.soak_load``: query and bulk
clients with pauses, sprinkled with invalid requests, cut connections and abandoned requests).
Every ``--sample-every`` seconds it records the RSS of every mesh process (supervisor, broker,
worker(s), ingress(es)), their pids and the load's counts. The JSON at ``--out`` holds the
time series and a summary: RSS per process after the warm-up, at the end and at most; requests
by outcome; unexpected errors; processes that died or appeared (a crash the supervisor
restarted shows only there). Exit 1 on any unexpected error, restart, or unclean stop.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson

from bench.corpus import DEFAULT_CORPUS, load_texts
from bench.harness.soak_load import LoadConfig, Outcome, load_main
from bench.harness.watch import appeared, sample_processes, vanished
from bench.spawn import SpawnedMesh
from bench.stats import percentile

MODEL = "all-MiniLM-L6-v2"
MESH_ROLES = frozenset({"supervisor", "broker", "worker", "ingress"})  # not helpers
REQUEST_OUTCOMES = ("ok", "expected_4xx", "disconnects", "client_timeouts", "unexpected")


def percentiles(values: list[float]) -> dict[str, float]:
    """Count, p50/p90/p99 and max in ms of latencies in seconds (empty dict for none)."""
    if not values:
        return {}
    ms = [1000 * v for v in values]
    return {
        "n": len(ms),
        **{f"p{q}_ms": round(percentile(ms, q), 1) for q in (50, 90, 99)},
        "max_ms": round(max(ms), 1),
    }


def summarize(
    samples: list[dict[str, Any]],
    warmup_s: float,
    errors: list[str],
    exit_code: int | None,
) -> dict[str, Any]:
    """The figures of a run from its samples (``t_s``, ``procs``: pid/role/rss_kb, ``counts``)."""
    if not samples:
        return {"failures": ["no sample was taken"]}
    # The RSS baseline: the first sample after the warm-up (the last one for a short run).
    first = next((i for i, s in enumerate(samples) if s["t_s"] >= warmup_s), len(samples) - 1)
    memory: dict[str, dict[str, Any]] = {}
    for i, sample in enumerate(samples):
        for p in sample["procs"]:
            entry = memory.setdefault(
                f"{p['role']}:{p['pid']}", {"role": p["role"], "pid": p["pid"], "rss_max_kb": 0}
            )
            entry["rss_max_kb"] = max(entry["rss_max_kb"], p["rss_kb"])
            entry["rss_end_kb"] = p["rss_kb"]
            if i >= first and "rss_start_kb" not in entry:
                entry["rss_start_kb"] = p["rss_kb"]
    for entry in memory.values():
        if "rss_start_kb" in entry:
            entry["rss_growth_kb"] = entry["rss_end_kb"] - entry["rss_start_kb"]
    seen = [{p["pid"]: p["role"] for p in s["procs"] if p["role"] in MESH_ROLES} for s in samples]
    died = vanished(seen[0], seen[1:])
    new = appeared(seen[0], seen[1:])
    counts = samples[-1]["counts"]
    summary = {
        "duration_s": samples[-1]["t_s"],
        "warmup_s": warmup_s,
        "rss_start_at_s": samples[first]["t_s"],
        "memory": memory,
        "counts": counts,
        # Probes are counted in ok as well, and ok_texts counts texts, not requests.
        "requests": sum(counts.get(k, 0) for k in REQUEST_OUTCOMES),
        "unexpected_errors": errors,
        "died": {str(pid): role for pid, role in died.items()},
        "appeared": {str(pid): role for pid, role in new.items()},
        "exit_code": exit_code,
    }
    summary["failures"] = failures(summary)
    return summary


def failures(summary: dict[str, Any]) -> list[str]:
    """Why the run failed; empty when it passed."""
    out = []
    counts = summary["counts"]
    if counts.get("unexpected", 0):
        out.append(f"{counts['unexpected']} unexpected errors")
    if not counts.get("ok", 0):
        out.append("no request succeeded")
    for pid, role in summary["died"].items():
        out.append(f"{role} (pid {pid}) died during the run")
    for pid, role in summary["appeared"].items():
        out.append(f"a new {role} (pid {pid}) appeared: a restart")
    if summary["exit_code"] not in (0, None):
        out.append(f"mesh-launch exited with {summary['exit_code']}")
    return out


def _take(mesh: SpawnedMesh, t0: float, counters: Any) -> dict[str, Any]:
    assert mesh.proc is not None
    procs = [
        {"pid": p.pid, "role": p.role, "rss_kb": p.rss_kb}
        for p in sample_processes([mesh.proc.pid])
    ]
    counts = {o.name.lower(): int(counters[o]) for o in Outcome}
    return {"t_s": round(time.monotonic() - t0, 1), "procs": procs, "counts": counts}


def _drain(events: Any, errors: list[str], latencies: dict[str, list[float]]) -> None:
    while True:
        try:
            kind, payload = events.get_nowait()
        except queue.Empty:
            return
        if kind == "error":
            errors.append(payload)
        elif kind == "latency":
            latencies.update(payload)


def _write(out: Path, doc: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


@click.command()
@click.option("--minutes", type=float, default=30.0, show_default=True, help="Length of the run.")
@click.option("--warmup", "warmup_s", type=float, default=60.0, show_default=True,
              help="Seconds of load before the RSS baseline is taken.")  # fmt: skip
@click.option("--sample-every", type=float, default=10.0, show_default=True,
              help="Seconds between samples of RSS, pids and counts.")  # fmt: skip
@click.option("--query-clients", type=int, default=2, show_default=True,
              help="Clients sending 1-text queries.")  # fmt: skip
@click.option("--bulk-clients", type=int, default=1, show_default=True,
              help="Clients sending 16-64-text requests.")  # fmt: skip
@click.option("--query-pause", type=(float, float), default=(0.1, 1.0), show_default=True,
              help="Seconds a query client waits between requests (uniform in the range).")  # fmt: skip
@click.option("--bulk-pause", type=(float, float), default=(1.0, 4.0), show_default=True,
              help="Seconds a bulk client waits between requests.")  # fmt: skip
@click.option("--misbehave", type=(float, float, float), default=(0.02, 0.01, 0.01),
              show_default=True, help="Chance per request of an invalid request, a cut "
              "connection, an abandoned request (client-side timeout).")  # fmt: skip
@click.option("--mesh-args", default="", show_default=True,
              help="Extra mesh-launch flags, e.g. '--ingress-procs 2'.")  # fmt: skip
@click.option("--model", default=MODEL, show_default=True, help="Served model name.")
@click.option("--corpus", type=click.Path(dir_okay=False), default=str(DEFAULT_CORPUS),
              show_default=True, help="JSON lines with a 'text' field.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Load's random seed.")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="Where the JSON goes (rewritten after every sample).")  # fmt: skip
def main(
    minutes: float,
    warmup_s: float,
    sample_every: float,
    query_clients: int,
    bulk_clients: int,
    query_pause: tuple[float, float],
    bulk_pause: tuple[float, float],
    misbehave: tuple[float, float, float],
    mesh_args: str,
    model: str,
    corpus: str,
    seed: int,
    out: str,
) -> None:
    """Soak a mesh under moderate load; the figures go to --out."""
    texts = load_texts(corpus)
    p_invalid, p_disconnect, p_timeout = misbehave
    cfg = LoadConfig(
        "", model, query_clients, bulk_clients, query_pause, bulk_pause,
        p_invalid=p_invalid, p_disconnect=p_disconnect, p_timeout=p_timeout, seed=seed,
    )  # fmt: skip
    doc: dict[str, Any] = {"command": sys.argv, "config": None, "samples": []}
    summary = run(texts, cfg, mesh_args, minutes * 60, warmup_s, sample_every, Path(out), doc)
    for line in report_lines(summary):
        print(line)
    sys.exit(1 if summary["failures"] else 0)


def run(
    texts: list[str],
    cfg: LoadConfig,
    mesh_args: str,
    duration_s: float,
    warmup_s: float,
    sample_every: float,
    out: Path,
    doc: dict[str, Any],
) -> dict[str, Any]:
    """Start the mesh and the load, sample until ``duration_s``, stop both, summarize."""
    ctx = multiprocessing.get_context("spawn")
    counters = ctx.Array("q", len(Outcome), lock=False)
    events, stop = ctx.Queue(), ctx.Event()
    errors: list[str] = []
    latencies: dict[str, list[float]] = {}
    mesh = SpawnedMesh(mesh_args)
    url = mesh.start()
    cfg = dataclasses.replace(cfg, url=url)
    doc["config"] = {**cfg.__dict__, "mesh": mesh.describe(), "warmup_s": warmup_s}
    load = ctx.Process(target=load_main, args=(cfg, texts, counters, events, stop), daemon=True)
    load.start()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < duration_s and load.is_alive():
            time.sleep(max(0.0, min(sample_every, duration_s - (time.monotonic() - t0))))
            doc["samples"].append(_take(mesh, t0, counters))
            _drain(events, errors, latencies)
            _write(out, doc)
        if not load.is_alive():
            errors.append(f"the load process exited with {load.exitcode}")
            counters[Outcome.UNEXPECTED] += 1
        stop.set()
        deadline = time.monotonic() + cfg.request_timeout_s + 10
        while load.is_alive() and time.monotonic() < deadline:
            _drain(events, errors, latencies)  # a full queue would keep it from exiting
            load.join(0.2)
        _drain(events, errors, latencies)
        doc["samples"].append(_take(mesh, t0, counters))
        doc["mesh_log_tail"] = mesh.log_tail(4000)
    finally:
        if load.is_alive():
            load.kill()
        exit_code = mesh.stop()
    summary = summarize(doc["samples"], warmup_s, errors, exit_code)
    summary["latency"] = {kind: percentiles(v) for kind, v in latencies.items()}
    doc["summary"] = summary
    _write(out, doc)
    return summary


def report_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as a few lines for a terminal."""
    lines = [f"soak: {summary.get('duration_s', 0):.0f}s, counts {summary.get('counts')}"]
    for name, m in sorted(summary.get("memory", {}).items()):
        lines.append(
            f"  {name:20s} RSS start {m.get('rss_start_kb', 0) / 1024:7.1f} MiB  "
            f"end {m['rss_end_kb'] / 1024:7.1f} MiB  max {m['rss_max_kb'] / 1024:7.1f} MiB"
        )
    lines.append(f"  latency {summary.get('latency')}")
    lines += [f"  error: {e}" for e in summary.get("unexpected_errors", [])[:20]]
    lines.append("PASS" if not summary["failures"] else f"FAIL: {summary['failures']}")
    return lines


if __name__ == "__main__":
    main()

"""What each ``--mode`` sends: load jobs per process, per measured window, per lane.

- ``closed``: C clients back to back; ``open``: Poisson arrivals at a rate;
- ``mixed``: bulk (C clients of 64-text requests on the batch lane) alone for one window, then
  bulk plus live queries (one short query each, evenly spaced at ``--live-rate``, on the
  interactive lane) for a second window of the same length: both lanes' latency, and the bulk
  rate with live traffic over the bulk rate alone, measured in the same run. ``--live-rate``
  repeated (``--live-rate 0.2 --live-rate 1 --live-rate 5 --live-rate 20``) measures one such
  window per rate after the one of bulk alone: a live query's p50/p99 from sparse to dense
  arrivals, and the bulk rate beside each, in one command. Only the live
  queries ask for the ingress's per-hop timings (``X-Embedmesh-Timings``): the bulk's would
  cost it and nobody reads them.

``--procs N`` cuts the bulk (or the only) lane over N load processes. In ``mixed`` the live
queries always get a process of their own: a load loop busy parsing bulk answers would delay a
query's timestamps and charge the mesh for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.corpus import request_bodies
from bench.load import Body
from bench.procs import Job, Timing, closed_jobs, open_jobs

BULK, LIVE, BULK_ALONE = "bulk", "live", "bulk alone"
WIRE_LANES = {BULK: "batch", LIVE: "interactive"}  # the lane each asks the ingress for


@dataclass
class Phase:
    """One measured window: the jobs of each load process, and each lane's load label."""

    per_process: list[list[Job]]
    timing: Timing
    loads: dict[str, str]  # lane -> what the report's "load" column says
    spawn: bool  # in processes of their own (else on the bench's own event loop)


@dataclass(frozen=True)
class Workload:
    """The request bodies a mode cycles through."""

    passages: list[str]  # every corpus text: the closed, open and bulk loads
    queries: list[str]  # kind: query texts: the latency mode and the live lane


def phases(mode: str, work: Workload, o: dict[str, Any]) -> list[Phase]:
    """The windows ``mode`` measures, in order, from the CLI options ``o``."""
    procs = o["procs"]
    if procs < 1:
        raise ValueError("--procs must be at least 1")
    timing = Timing(None if o["requests"] else o["duration"], o["warmup"])
    if mode == "closed":
        tpr, conc = o["texts_per_request"], o["concurrency"]
        jobs = closed_jobs("", _bodies(work.passages, o, tpr), conc, procs, o["requests"])
        return [_phase([[j] for j in jobs], timing, {"": f"{conc} clients x{tpr}"})]
    if mode == "open":
        tpr, rate = o["texts_per_request"], o["rate"]
        if not rate:
            raise ValueError("--mode open needs --rate")
        bodies = _bodies(work.passages, o, tpr)
        jobs = open_jobs("", bodies, rate, procs, count=o["requests"], seed=o["seed"])
        return [_phase([[j] for j in jobs], timing, {"": f"{rate:g}/s Poisson x{tpr}"})]
    if mode == "mixed":
        return _mixed(work, o, timing)
    raise ValueError(f"no load phases for mode {mode!r}")


def _mixed(work: Workload, o: dict[str, Any], timing: Timing) -> list[Phase]:
    if o["requests"]:
        raise ValueError("--mode mixed measures by --duration, not --requests")
    tpr, conc = o["bulk_texts_per_request"], o["concurrency"]
    rates = o["live_rate"] if isinstance(o["live_rate"], tuple | list) else (o["live_rate"],)
    if not rates or min(rates) <= 0:
        raise ValueError("--mode mixed needs a positive --live-rate")
    bulk_bodies = _bodies(work.passages, o, tpr, WIRE_LANES[BULK])
    live_bodies = _bodies(work.queries, o, 1, WIRE_LANES[LIVE])
    bulk_load = f"{conc} clients x{tpr}, batch lane"
    alone = closed_jobs(BULK_ALONE, bulk_bodies, conc, o["procs"])
    planned = [Phase([[j] for j in alone], timing, {BULK_ALONE: bulk_load}, spawn=True)]
    for rate in rates:
        bulk = closed_jobs(BULK, bulk_bodies, conc, o["procs"])
        # Only the live queries ask for per-hop timings: where a query's time goes under bulk.
        live = open_jobs(LIVE, live_bodies, rate, 1, seed=o["seed"], even=True, timings=True)
        beside = f"{bulk_load}, beside {rate:g}/s live" if len(rates) > 1 else bulk_load
        loads = {BULK: beside, LIVE: f"{rate:g}/s x1 query, interactive lane"}
        planned.append(Phase([[j] for j in bulk] + [live], timing, loads, spawn=True))
    return planned


def _phase(per_process: list[list[Job]], timing: Timing, loads: dict[str, str]) -> Phase:
    # One process: the bench's own loop, as before --procs existed (no start-up, no pickling).
    return Phase(per_process, timing, loads, spawn=len(per_process) > 1)


def _bodies(
    texts: list[str], o: dict[str, Any], per_request: int, priority: str | None = None
) -> list[Body]:
    if priority is None and o.get("priority", "auto") != "auto":
        priority = o["priority"]
    return request_bodies(texts, o["model_name"], per_request, o["encoding_format"], priority)

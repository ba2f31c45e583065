"""Per-role figures of a cluster run, from the ingresses' ``/metrics`` during the window.

Read defensively: the series a mesh exposes change as it grows, so nothing here names one.
Every ``embedmesh_*`` series is kept by its kind: a gauge sampled through the window (mean,
max, last), a counter as its rate over the window, a histogram as the mean observation in
the window. The role is the name's second word (``embedmesh_broker_queued_tokens``: broker).
Then the figures a reader looks for first, picked by what the names and labels say: queue
depth (a gauge named ``queue``/``queued``, by lane where labelled), batch fill (a series
named ``fill``, or tokens in batches over the workers' budgets where a mesh counts both),
per-worker figures (a ``worker`` label).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "embedmesh_"


@dataclass
class Scrape:
    """One read of /metrics: gauge, counter and histogram series by ``name{labels}``."""

    at: float
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, tuple[float, float]] = field(default_factory=dict)  # (sum, count)


def series_key(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


def parse(text: str, at: float = 0.0) -> Scrape:
    """The ``embedmesh_*`` series of a Prometheus text exposition (others ignored)."""
    out = Scrape(at)
    hist: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # when a series was made, not a figure
            key = series_key(s.name, s.labels)
            if family.type == "gauge":
                out.gauges[key] = float(s.value)
            elif family.type == "counter" and s.name.endswith("_total"):
                out.counters[key] = float(s.value)
            elif family.type == "histogram" and s.name.endswith(("_sum", "_count")):
                base, part = s.name.rsplit("_", 1)
                acc = hist.setdefault(series_key(base, s.labels), [0.0, 0.0])
                acc[0 if part == "sum" else 1] = float(s.value)
    out.histograms = {k: (v[0], v[1]) for k, v in hist.items()}
    return out


class Watch:
    """Scrapes ``read()`` (a /metrics body, or None when it cannot be read) at ``start``,
    every ``every_s`` seconds, and at ``stop``; ``figures`` summarizes the window."""

    def __init__(self, read: Callable[[], str | None], every_s: float = 1.0) -> None:
        self.read = read
        self.every_s = every_s
        self.scrapes: list[Scrape] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _one(self) -> None:
        text = self.read()
        if text is None:
            self.failed += 1
            return
        self.scrapes.append(parse(text, time.monotonic()))

    def start(self) -> None:
        self._one()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="metrics watch")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._one()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._one()

    def figures(self) -> dict[str, Any]:
        return figures(self.scrapes) | {"scrapes": len(self.scrapes), "failed": self.failed}


def figures(scrapes: list[Scrape]) -> dict[str, Any]:
    """Per role, every series summarized over the scrapes; the headline figures picked out."""
    if not scrapes:
        return {"roles": {}, "queue_depth": {}, "batch_fill": {}, "per_worker": {}}
    first, last = scrapes[0], scrapes[-1]
    span = max(last.at - first.at, 1e-9)
    roles: dict[str, dict[str, Any]] = {}
    for key in sorted({k for s in scrapes for k in s.gauges}):
        values = [s.gauges[key] for s in scrapes if key in s.gauges]
        entry = {"mean": sum(values) / len(values), "max": max(values), "last": values[-1]}
        roles.setdefault(_role(key), {})[key] = entry
    for key, value in last.counters.items():
        roles.setdefault(_role(key), {})[key] = {
            "per_s": (value - first.counters.get(key, 0.0)) / span
        }
    for key, (s1, c1) in last.histograms.items():
        s0, c0 = first.histograms.get(key, (0.0, 0.0))
        mean = (s1 - s0) / (c1 - c0) if c1 > c0 else None
        roles.setdefault(_role(key), {})[key] = {"mean": mean, "count": c1 - c0}
    flat = {k: v for role in roles.values() for k, v in role.items()}
    return {
        "roles": roles,
        "queue_depth": {k: v for k, v in flat.items() if _named(k, "queue") and "mean" in v
                        and "max" in v},
        "batch_fill": {k: v for k, v in flat.items() if _named(k, "fill")} | _fills(first, last),
        "per_worker": {k: v for k, v in flat.items() if 'worker="' in k},
    }  # fmt: skip


def _fills(first: Scrape, last: Scrape) -> dict[str, dict[str, float]]:
    """Batch fill from a counter pair, where a mesh exports one: tokens dispatched in batches
    over the budgets of the workers they went to (``..._batch_tokens_total`` and
    ``..._batch_budget_tokens_total`` of the same labels), over the window."""
    out = {}
    for key, budget in last.counters.items():
        name, _, labels = key.partition("{")
        if not name.endswith("_batch_budget_tokens_total"):
            continue
        used_key = name.replace("_batch_budget_tokens_total", "_batch_tokens_total") + "{" + labels
        if used_key not in last.counters:
            continue
        spent = budget - first.counters.get(key, 0.0)
        used = last.counters[used_key] - first.counters.get(used_key, 0.0)
        if spent > 0:
            fill_key = name.replace("_batch_budget_tokens_total", "_batch_fill") + "{" + labels
            out[fill_key if labels else fill_key[:-1]] = {"mean": used / spent}
    return out


def _role(key: str) -> str:
    return key.removeprefix(PREFIX).split("_", 1)[0].split("{", 1)[0]


def _named(key: str, word: str) -> bool:
    return word in key.split("{", 1)[0]

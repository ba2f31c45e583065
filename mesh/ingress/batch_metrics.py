"""Batch progress gauges for ``/metrics``, from a snapshot the batch runner refreshes on its
sweep (every few seconds), so a scrape never waits on the database. The store is shared, so
every ingress process reports the same numbers: the unfinished batches of the whole store.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mesh.jobs import Batch, BatchStatus


class BatchProgress(Collector):
    def __init__(self) -> None:
        self.unfinished: list[Batch] = []
        self.seen = False  # a snapshot was taken: there is a store to describe

    def update(self, batches: list[Batch]) -> None:
        self.unfinished = [b for b in batches if not b.status.terminal]
        self.seen = True

    def describe(self) -> list[Metric]:
        return []  # series are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        if not self.seen:
            return
        batches = self.unfinished
        by_status = GaugeMetricFamily(
            "embedmesh_batches", "Unfinished batches, by status.", labels=["status"]
        )
        counts = Counter(b.status for b in batches)
        for status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS,
                       BatchStatus.FINALIZING, BatchStatus.CANCELLING):  # fmt: skip
            by_status.add_metric([str(status)], counts[status])
        requests = GaugeMetricFamily(
            "embedmesh_batch_requests", "Lines of the unfinished batches: total, completed, "
            "failed.", labels=["state"],
        )  # fmt: skip
        tokens = GaugeMetricFamily(
            "embedmesh_batch_tokens", "Tokens of the unfinished batches: done, and total "
            "(estimated at validation).", labels=["state"],
        )  # fmt: skip
        for name in ("total", "completed", "failed"):
            requests.add_metric([name], sum(getattr(b.request_counts, name) for b in batches))
        tokens.add_metric(["done"], sum(b.tokens_done for b in batches))
        tokens.add_metric(["total"], sum(b.tokens_total for b in batches))
        now = time.time()
        rates = [b.rate_and_eta(now) for b in batches]
        rate = GaugeMetricFamily(
            "embedmesh_batch_tokens_per_second", "Tokens per second of the running batches."
        )
        rate.add_metric([], sum(r for r, _ in rates))
        eta = GaugeMetricFamily(
            "embedmesh_batch_eta_seconds", "Seconds until the last running batch is done, at "
            "its rate so far (0: none known).",
        )  # fmt: skip
        eta.add_metric([], max((e for _, e in rates if e is not None), default=0.0))
        yield from (by_status, requests, tokens, rate, eta)

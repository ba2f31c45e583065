"""Series read at scrape time from each broker's latest Pong, as this process's links see them.

The broker has no HTTP: every heartbeat interval each ingress process pings each broker it is
linked to, and the Pong carries ``BrokerStats`` (queues by model and lane, counters of the work
done, queue-wait histograms, batch fill, each worker's state). A scrape turns the latest one
into series; it costs no broker round trip and nothing on a request's path. The values are at
most one heartbeat interval old. A broker that is down shows ``embedmesh_broker_up 0`` and when
it was last seen, but no queue series: what it last said is no longer true. (The links'
failovers are a counter of ``IngressMetrics``, summed over the ingress processes.)

Counters (``*_total``, the histogram) are the broker's since it started; a restarted broker
starts them again, which ``rate()`` reads as the reset it is. Worker series carry the worker's
name (host:device), the broker's id for its connection (``id``: several CPU workers of one host
share a name) and its model; gone workers stay listed as ``down`` for a while, at most
``mesh.broker.stats.DOWN_KEEP`` of them per broker, so labels stay few.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mesh.client import MeshClient
from mesh.client.connection import BrokerConnection
from proto_msgs import BrokerStats, Lane
from proto_msgs.stats import WAIT_BUCKETS_S, WORKER_STATES

LANES = tuple(lane.name.lower() for lane in Lane)  # label values, in Lane order
MAX_WORKER_SERIES = 256  # workers exported per broker: a bound on labels whatever it sends
_WORKER_LABELS = ["broker", "worker", "id", "model"]


def _gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["broker", *labels])


def _counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["broker", *labels])


class BrokerCollector(Collector):
    """Gauges, counters and histograms of each broker and its workers."""

    def __init__(self, client: MeshClient) -> None:
        self.client = client

    def describe(self) -> list[Metric]:
        return []  # series are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for link in self.client.brokers:
            families.add_link(link)
            if link.alive and link.stats is not None:
                families.add_stats(link.endpoint, link.stats)
        yield from families.all()


class _Families:
    """One scrape's metric families, filled broker by broker."""

    def __init__(self) -> None:
        self.up = _gauge("embedmesh_broker_up", "1 when the broker answers.")
        self.last_seen = _gauge(
            "embedmesh_broker_last_seen_seconds", "Seconds since the broker last sent anything."
        )
        self.inflight = _gauge(
            "embedmesh_broker_inflight_batches", "Batches dispatched to workers, not returned."
        )
        self.dropped = _gauge(
            "embedmesh_broker_dropped_frames", "Malformed messages the broker dropped."
        )
        self.per_model = {
            "queued_tokens": _gauge(
                "embedmesh_broker_queued_tokens", "Tokens waiting in the broker's queue.", "model"
            ),
            "queued_sequences": _gauge(
                "embedmesh_broker_queued_sequences", "Sequences waiting in the broker's queue.",
                "model",
            ),
            "workers": _gauge("embedmesh_broker_workers", "Workers serving the model.", "model"),
        }  # fmt: skip
        self.queued_s = _gauge(
            "embedmesh_broker_queued_work_seconds",
            "Seconds the model's workers need for its queued tokens at their measured rate "
            "(0 while the rate is unknown): the scaling signal.",
            "model",
        )
        self.rate = _gauge(
            "embedmesh_broker_drain_rate_tokens_per_second",
            "Tokens per second the model's workers compute together, as measured.",
            "model",
        )
        self.lane_tokens = _gauge(
            "embedmesh_broker_lane_queued_tokens", "Tokens waiting, by lane.", "model", "lane"
        )
        self.lane_sequences = _gauge(
            "embedmesh_broker_lane_queued_sequences", "Sequences waiting, by lane.", "model", "lane"
        )
        self.done_tokens = _counter(
            "embedmesh_broker_lane_tokens", "Tokens computed (batch returned), by lane.",
            "model", "lane",
        )  # fmt: skip
        self.done_sequences = _counter(
            "embedmesh_broker_lane_sequences", "Sequences computed (batch returned), by lane.",
            "model", "lane",
        )  # fmt: skip
        self.wait = HistogramMetricFamily(
            "embedmesh_broker_queue_wait_seconds",
            "Wait of each dispatched part of a request in the broker's queue, by lane.",
            labels=["broker", "model", "lane"],
        )
        self.batches = _counter("embedmesh_broker_batches", "Batches dispatched.", "model")
        self.batch_tokens = _counter(
            "embedmesh_broker_batch_tokens", "Tokens in the batches dispatched.", "model"
        )
        self.batch_budget = _counter(
            "embedmesh_broker_batch_budget_tokens",
            "The token budgets of the workers the batches went to; batch fill is "
            "rate(batch_tokens) / rate(batch_budget_tokens).",
            "model",
        )
        self.worker_state = GaugeMetricFamily(
            "embedmesh_worker_state", "1 for the worker's state (up, busy, down), else 0.",
            labels=[*_WORKER_LABELS, "device", "state"],
        )  # fmt: skip
        self.worker_inflight = GaugeMetricFamily(
            "embedmesh_worker_inflight_batches", "Batches the worker holds.", labels=_WORKER_LABELS
        )
        self.worker_rate = GaugeMetricFamily(
            "embedmesh_worker_tokens_per_second", "The worker's measured compute rate.",
            labels=_WORKER_LABELS,
        )  # fmt: skip
        self.worker_tokens = CounterMetricFamily(
            "embedmesh_worker_tokens", "Tokens the worker computed.", labels=_WORKER_LABELS
        )
        self.worker_batches = CounterMetricFamily(
            "embedmesh_worker_batches", "Batches the worker returned.", labels=_WORKER_LABELS
        )

    def add_link(self, link: BrokerConnection) -> None:
        ep = link.endpoint
        self.up.add_metric([ep], 1.0 if link.alive else 0.0)
        ago = link.heard_ago()
        if ago is not None:
            self.last_seen.add_metric([ep], ago)

    def add_stats(self, ep: str, stats: BrokerStats) -> None:
        self.inflight.add_metric([ep], stats.inflight_batches)
        self.dropped.add_metric([ep], stats.dropped_frames)
        for attr, family in self.per_model.items():
            for model, value in getattr(stats, attr).items():
                family.add_metric([ep, model], value)
        for model, rate in stats.drain_rate.items():
            self.rate.add_metric([ep, model], rate)
        for model, ms in stats.models.items():
            self.queued_s.add_metric([ep, model], ms.queued_s)
            self.batches.add_metric([ep, model], ms.batches)
            self.batch_tokens.add_metric([ep, model], ms.batch_tokens)
            self.batch_budget.add_metric([ep, model], ms.batch_budget_tokens)
            for lane, ls in zip(LANES, ms.lanes, strict=False):
                labels = [ep, model, lane]
                self.lane_tokens.add_metric(labels, ls.queued_tokens)
                self.lane_sequences.add_metric(labels, ls.queued_sequences)
                self.done_tokens.add_metric(labels, ls.tokens_done)
                self.done_sequences.add_metric(labels, ls.sequences_done)
                if len(ls.wait_counts) == len(WAIT_BUCKETS_S) + 1:
                    self.wait.add_metric(labels, _buckets(ls.wait_counts), ls.wait_sum_s)
        for worker in stats.worker_list[:MAX_WORKER_SERIES]:
            labels = [ep, worker.name, worker.id, worker.model]
            for state in WORKER_STATES:
                value = 1.0 if worker.state == state else 0.0
                self.worker_state.add_metric([*labels, worker.device, state], value)
            self.worker_inflight.add_metric(labels, worker.inflight_batches)
            self.worker_rate.add_metric(labels, worker.tokens_per_s)
            self.worker_tokens.add_metric(labels, worker.tokens_done)
            self.worker_batches.add_metric(labels, worker.batches_done)

    def all(self) -> Iterator[Metric]:
        yield self.up
        yield self.last_seen
        yield self.inflight
        yield self.dropped
        yield from self.per_model.values()
        yield from (self.queued_s, self.rate, self.lane_tokens, self.lane_sequences)
        yield from (self.done_tokens, self.done_sequences, self.wait)
        yield from (self.batches, self.batch_tokens, self.batch_budget)
        yield from (self.worker_state, self.worker_inflight, self.worker_rate)
        yield from (self.worker_tokens, self.worker_batches)


def _buckets(counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus's cumulative buckets from the broker's per-bucket counts."""
    out, total = [], 0
    for bound, count in zip((*map(repr, WAIT_BUCKETS_S), "+Inf"), counts, strict=True):
        total += count
        out.append((bound, float(total)))
    return out

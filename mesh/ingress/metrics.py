"""Prometheus metrics of one ingress, in a registry of its own (``GET /metrics``).

Request-side series are counted as requests pass; broker-side series (queue depth, queued
tokens, workers per model, liveness) are read at scrape time from the Pong stats the client
keeps for each broker, so a scrape always shows the latest heartbeat's view.

Results carry how long their sequences waited in the broker's queue and the compute time of the
batches that carried them: ``queue_duration`` and ``inference_duration``, beside
``mesh_duration`` (submit to last result, as the ingress sees it), all split by lane.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mesh.client import MeshClient

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


class IngressMetrics:
    def __init__(self, client: MeshClient | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "embedmesh_ingress_requests", "HTTP requests by route and status.",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            "embedmesh_ingress_errors", "Error responses by error code.", ["code"], registry=r
        )
        self.prompt_tokens = Counter(
            "embedmesh_ingress_prompt_tokens", "Tokens embedded, by model.", ["model"], registry=r
        )
        self.inputs = Counter(
            "embedmesh_ingress_inputs", "Inputs (sequences) embedded, by model.", ["model"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "embedmesh_ingress_request_duration_seconds", "Time to answer an HTTP request.",
            ["route"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokenize = Histogram(
            "embedmesh_ingress_tokenize_duration_seconds", "Time to tokenize one request.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.mesh = Histogram(
            "embedmesh_ingress_mesh_duration_seconds",
            "Inference time seen by the ingress: submit to last result (broker queue + batches).",
            ["model", "lane"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue = Histogram(
            "embedmesh_ingress_queue_duration_seconds",
            "Longest wait of a request's sequences in the broker queue before dispatch.",
            ["model", "lane"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.inference = Histogram(
            "embedmesh_ingress_inference_duration_seconds",
            "Worker compute time of the batches that carried a request.",
            ["model", "lane"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        if client is not None:
            r.register(BrokerCollector(client))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class BrokerCollector(Collector):
    """Gauges from each broker's latest Pong stats."""

    def __init__(self, client: MeshClient) -> None:
        self.client = client

    def describe(self) -> list[Metric]:
        return []  # series are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "embedmesh_broker_up", "1 when the broker answers.", labels=["broker"]
        )
        outstanding = GaugeMetricFamily(
            "embedmesh_broker_outstanding_tokens",
            "Tokens this ingress has submitted to the broker and not had back.", labels=["broker"],
        )  # fmt: skip
        inflight = GaugeMetricFamily(
            "embedmesh_broker_inflight_batches", "Batches dispatched to workers, not returned.",
            labels=["broker"],
        )  # fmt: skip
        dropped = GaugeMetricFamily(
            "embedmesh_broker_dropped_frames", "Malformed messages the broker dropped.",
            labels=["broker"],
        )  # fmt: skip
        per_model = {
            "queued_tokens": GaugeMetricFamily(
                "embedmesh_broker_queued_tokens", "Tokens waiting in the broker's queue.",
                labels=["broker", "model"],
            ),
            "queued_sequences": GaugeMetricFamily(
                "embedmesh_broker_queued_sequences", "Sequences waiting in the broker's queue.",
                labels=["broker", "model"],
            ),
            "workers": GaugeMetricFamily(
                "embedmesh_broker_workers", "Workers serving the model.", labels=["broker", "model"]
            ),
        }  # fmt: skip
        for broker in self.client.brokers:
            ep = broker.endpoint
            up.add_metric([ep], 1.0 if broker.alive else 0.0)
            outstanding.add_metric([ep], broker.outstanding_tokens)
            stats = broker.stats
            if not broker.alive or stats is None:
                continue
            inflight.add_metric([ep], stats.inflight_batches)
            dropped.add_metric([ep], stats.dropped_frames)
            for attr, family in per_model.items():
                for model, value in getattr(stats, attr).items():
                    family.add_metric([ep, model], value)
        yield from (up, outstanding, inflight, dropped, *per_model.values())

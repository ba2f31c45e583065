"""Prometheus metrics of the ingress (``GET /metrics``): one registry, however many processes.

Request-side series are counted as requests pass; broker-side series (queues by model and
lane, work done, queue waits, batch fill, each worker's state, the links' liveness) are read at
scrape time from the Pong stats the client keeps for each broker, so a scrape always shows the
latest heartbeat's view (``mesh.ingress.broker_metrics``).

Results carry how long their sequences waited in the broker's queue and the compute time of the
batches that carried them: ``queue_duration`` and ``inference_duration``, beside
``mesh_duration`` (submit to last result, as the ingress sees it), all split by lane.

**Several ingress processes** (``mesh-launch --ingress-procs N``) share one port through
SO_REUSEPORT, so a scrape reaches one of them at random. With a registry per process every
counter would jump between scrapes (each process's own count), which ``rate()`` reads as
resets. So the processes share one registry: prometheus_client's multiprocess mode. The parent
makes a private directory before it spawns them and hands it down as ``PROMETHEUS_MULTIPROC_DIR``;
each process writes its counters and histograms to its own mmap files there, and any process's
``/metrics`` merges every file (``MultiProcessCollector``): the sum over all the processes that
have served since start, exited ones included, so counters never go backwards when one exits.
Chosen over a ``pid`` label per process because a scrape that reaches one process would see
only that process's series, and the series would multiply with N and with every restart.

Broker gauges describe the broker, the same whichever process reads them; the answering process
reports its own links' view (as ``/health`` does). The one gauge that belongs to each process,
``embedmesh_broker_outstanding_tokens``, is a ``livesum`` gauge: each process refreshes its
share every second and on a scrape (and adds its links' failovers to
``embedmesh_broker_failovers``, a counter summed like the request counters), and the parent calls ``mark_process_dead`` when a child
exits so that a dead process's share leaves the sum. Without ``PROMETHEUS_MULTIPROC_DIR`` (one
process) the registry lives in memory, as it always did.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from mesh.client import MeshClient
from mesh.ingress.broker_metrics import BrokerCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# prometheus_client picks its value store when it is imported: files under this directory when
# the variable is set (several processes), memory otherwise. Set by the parent, never changed.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


def multiprocess_dir() -> str | None:
    """The directory the ingress processes share their series in; None for one process."""
    return os.environ.get(MULTIPROC_ENV) or None


class IngressMetrics:
    def __init__(self, client: MeshClient | None = None) -> None:
        self.client = client
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
        self.outstanding = Gauge(
            "embedmesh_broker_outstanding_tokens",
            "Tokens the ingress processes have submitted to the broker and not had back.",
            ["broker"], multiprocess_mode="livesum", registry=r,
        )  # fmt: skip
        # A counter of every process (a link's own count, added as it grows): summed over the
        # processes, exited ones included, so a scrape reaching any process reads one total.
        self.failovers = Counter(
            "embedmesh_broker_failovers",
            "Times an ingress process lost the broker or found it restarted (its pending "
            "requests failed over).",
            ["broker"], registry=r,
        )  # fmt: skip
        self._failovers_seen: dict[str, int] = {}
        # What a scrape reads: this registry alone, or every process's files merged.
        self.exposed = r
        if (path := multiprocess_dir()) is not None:
            self.exposed = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(self.exposed, path)
        if client is not None:
            self.exposed.register(BrokerCollector(client))

    def publish(self) -> None:
        """Write this process's outstanding tokens per broker (its share of the sum), and add
        its links' failovers since the last call."""
        if self.client is not None:
            for broker in self.client.brokers:
                ep = broker.endpoint
                self.outstanding.labels(ep).set(broker.outstanding_tokens)
                new = broker.failovers - self._failovers_seen.get(ep, 0)
                self.failovers.labels(ep).inc(max(0, new))
                self._failovers_seen[ep] = broker.failovers

    def render(self) -> bytes:
        self.publish()
        return generate_latest(self.exposed)

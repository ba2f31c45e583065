"""What the ingress tells of the models: served now (from the brokers) and health.

Readiness (``/health``, ``/health/ready``, TEI's ``GET /``) says whether requests can be served
now: 503 while no broker answers or a model has no live worker, so a load balancer or a
Kubernetes readiness probe takes the process out of rotation until the mesh behind it serves.
Liveness (``/health/live``) says only that the process is sound: restarting an ingress brings
no broker and no worker back, so it stays 200 whatever the mesh does.

The models ever seen have one owner, the client's ``ModelBook`` (``MeshClient.seen``): a request
for a model seen before but without a worker now is *unavailable* (503, retry later), not
*unknown* (404), and ``/health`` stays red until each of them has a worker again, or until it
has been unserved for ``FORGET_UNSERVED_AFTER_S`` (10 minutes: then it is taken as retired and
forgotten, so ``/health`` turns green and requests for it get 404).
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.client import MeshClient
from mesh.client.connection import BrokerConnection
from proto_msgs import ModelInfo


@dataclass
class Health:
    ok: bool
    body: dict[str, object]


@dataclass
class Catalog:
    client: MeshClient

    def refresh(self) -> list[ModelInfo]:
        """The models served now (the client remembers them as seen)."""
        return self.client.models()

    def created(self, name: str) -> int:
        """Unix time this ingress first saw ``name``: OpenAI's ``created``."""
        seen = self.client.seen.find(name)
        return seen.first_seen if seen is not None else 0

    def health(self, model: str | None = None) -> Health:
        """Readiness: ok when a broker answers and every model seen (or ``model``, a name or
        alias) has a live worker now; the body names what is missing and shows each broker
        and the workers behind it."""
        served = {m.name: m.workers for m in self.refresh()}
        brokers = [broker_health(b) for b in self.client.brokers]
        models = {name: served.get(name, 0) for name in self.client.seen.names()}
        if model is not None:
            seen = self.client.seen.find(model)
            models = {seen.info.name: served.get(seen.info.name, 0)} if seen else {model: 0}
        body: dict[str, object] = {"brokers": brokers, "models": models}
        if not any(b.alive for b in self.client.brokers):
            reason = "no broker is reachable"
        elif not models:
            reason = "no worker has announced a model yet"
        elif missing := sorted(name for name, n in models.items() if n == 0):
            reason = f"no worker serves {', '.join(missing)}"
        else:
            return Health(True, {"status": "ok", **body})
        return Health(False, {"status": "unavailable", "reason": reason, **body})

    def liveness(self) -> Health:
        """Liveness: the process is sound, whatever the mesh behind it does. Unsound only when
        a broker link's pinger has ended: that link would never come back without a restart."""
        stopped = [b.endpoint for b in self.client.brokers if not b.sound()]
        if stopped:
            reason = f"the link to {', '.join(stopped)} stopped pinging; restart this process"
            return Health(False, {"status": "unavailable", "reason": reason})
        return Health(True, {"status": "ok"})


def broker_health(link: BrokerConnection) -> dict[str, object]:
    """One broker as ``/health`` shows it: the link, its queues, each worker behind it."""
    ago = link.heard_ago()
    doc: dict[str, object] = {
        "endpoint": link.endpoint,
        "alive": link.alive,
        "last_seen_s": None if ago is None else round(ago, 3),
        "failovers": link.failovers,
    }
    stats = link.stats
    if link.alive and stats is not None:
        doc["queued_tokens"] = stats.queued_tokens
        doc["queued_work_s"] = {m: round(s.queued_s, 3) for m, s in stats.models.items()}
        doc["inflight_batches"] = stats.inflight_batches
        doc["workers"] = [
            {
                "id": w.id,
                "name": w.name,
                "model": w.model,
                "device": w.device,
                "state": w.state,
                "inflight_batches": w.inflight_batches,
                "tokens_per_s": round(w.tokens_per_s, 1),
                "since_s": round(w.since_s, 3),
                **({"reason": w.reason} if w.reason else {}),
            }
            for w in stats.worker_list
        ]
    return doc

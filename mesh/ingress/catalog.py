"""What the ingress knows of the models: served now (from the brokers) and ever seen.

Brokers list only models that have a live worker, so a model whose last worker just died
vanishes from the catalog. The ingress remembers every model it has seen: a request for one of
those is *unavailable* (503, retry later), not *unknown* (404), and ``/health`` stays red until
each of them has a worker again. "Each configured model" is therefore "each model a worker has
announced since this ingress started"; a model retired on purpose needs an ingress restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mesh.client import MeshClient
from proto_msgs import ModelInfo


@dataclass
class Health:
    ok: bool
    body: dict[str, object]


@dataclass
class Catalog:
    client: MeshClient
    seen: dict[str, ModelInfo] = field(default_factory=dict)  # canonical name → last info
    first_seen: dict[str, int] = field(default_factory=dict)  # name → unix time, for "created"

    def refresh(self) -> list[ModelInfo]:
        """The models served now; remembers them."""
        served = self.client.models()
        for info in served:
            self.seen[info.name] = info
            self.first_seen.setdefault(info.name, int(time.time()))
        return served

    def resolve(self, name: str) -> ModelInfo:
        """The served model called ``name`` (or an alias); ``MeshClient.resolve`` decides
        Unavailable (no broker, or a seen model without workers) versus ModelNotFound."""
        self.refresh()
        return self.client.resolve(name)

    def health(self) -> Health:
        served = {m.name: m.workers for m in self.refresh()}
        brokers = [{"endpoint": b.endpoint, "alive": b.alive} for b in self.client.brokers]
        models = {name: served.get(name, 0) for name in self.seen}
        body: dict[str, object] = {"brokers": brokers, "models": models}
        if not any(b.alive for b in self.client.brokers):
            reason = "no broker is reachable"
        elif not self.seen:
            reason = "no worker has announced a model yet"
        elif missing := sorted(name for name, n in models.items() if n == 0):
            reason = f"no worker serves {', '.join(missing)}"
        else:
            return Health(True, {"status": "ok", **body})
        return Health(False, {"status": "unavailable", "reason": reason, **body})

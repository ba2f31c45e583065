"""What the ingress tells of the models: served now (from the brokers) and health.

The models ever seen have one owner, the client's ``ModelBook`` (``MeshClient.seen``): a request
for a model seen before but without a worker now is *unavailable* (503, retry later), not
*unknown* (404), and ``/health`` stays red until each of them has a worker again, or until it
has been unserved for ``FORGET_UNSERVED_AFTER_S`` (10 minutes: then it is taken as retired and
forgotten, so ``/health`` turns green and requests for it get 404).
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.client import MeshClient
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

    def health(self) -> Health:
        served = {m.name: m.workers for m in self.refresh()}
        brokers = [{"endpoint": b.endpoint, "alive": b.alive} for b in self.client.brokers]
        models = {name: served.get(name, 0) for name in self.client.seen.names()}
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

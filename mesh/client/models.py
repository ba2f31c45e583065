"""The models a client has seen: the one owner of "seen", read by the ingress's catalog too.

Brokers list only models that have a live worker, so a model whose last worker just died
vanishes from their catalogs. Remembering it lets a request for it be *unavailable* (retry
later) rather than *unknown*, and lets ``/health`` stay red until it has a worker again. A model
unserved for ``forget_after_s`` is forgotten: it was retired, not lost, and ``/health`` turns
green without an ingress restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from proto_msgs import ModelInfo
from proto_msgs.checks import find_model

# How long a model with no worker is remembered (503 and a red /health), then forgotten (404,
# and /health no longer waits for it). Longer than a worker restart or a rolling deploy
# (seconds to minutes); 60..3600 s is reasonable.
FORGET_UNSERVED_AFTER_S = 600.0


@dataclass
class SeenModel:
    info: ModelInfo  # the latest card a broker listed
    first_seen: int  # unix seconds: OpenAI's "created"
    last_served: float  # monotonic seconds when a broker last listed it


class ModelBook:
    """Every model listed since start, by served name, until forgotten."""

    def __init__(self, forget_after_s: float = FORGET_UNSERVED_AFTER_S) -> None:
        self.forget_after_s = forget_after_s
        self._models: dict[str, SeenModel] = {}

    def note(self, served: list[ModelInfo], now: float | None = None) -> None:
        """Remember what is served now; forget what has been unserved for too long."""
        now = time.monotonic() if now is None else now
        for info in served:
            seen = self._models.get(info.name)
            if seen is None:
                self._models[info.name] = SeenModel(info, int(time.time()), now)
            else:
                seen.info, seen.last_served = info, now
        stale = now - self.forget_after_s
        for name in [n for n, m in self._models.items() if m.last_served < stale]:
            del self._models[name]

    def find(self, name: str) -> SeenModel | None:
        """The model called ``name`` or with that alias (``proto_msgs.checks.find_model``)."""
        info = find_model((m.info for m in self._models.values()), name)
        return None if info is None else self._models[info.name]

    def names(self) -> list[str]:
        return list(self._models)

    def __len__(self) -> int:
        return len(self._models)

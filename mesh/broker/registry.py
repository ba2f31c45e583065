"""Workers the broker knows: their model, budgets, credits and liveness. Pure, no sockets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mesh.config import RATE_MIN_BATCH_TOKENS
from proto_msgs import ModelInfo, WorkerReady
from proto_msgs.checks import find_model


@dataclass(slots=True)
class WorkerState:
    identity: bytes
    name: str
    model: ModelInfo
    max_batch_tokens: int
    max_batch_requests: int
    credits: int  # granted in READY
    free: int  # credits not in use now
    device: str
    last_heard: float
    expiry_s: float  # silence after which it is dead: its own heartbeat x the broker's liveness
    progress: int = 0  # batches the worker says it finished
    progress_at: float = 0.0  # when progress last moved (or a result came back)
    rate: float = 0.0  # tokens per second of compute on its large batches; 0 while unknown
    live_credits: int = 0  # of credits, those kept for its live lane (WorkerReady); 0: none
    live_tokens: int = 0  # the largest batch its live lane runs
    batches_done: int = 0  # results it returned (mesh.broker.stats counts them)
    tokens_done: int = 0
    # The rate is the worker's own measure from READY, not yet learned from its batches
    # (note_compute says how the first batch that teaches treats it).
    rate_announced: bool = False

    @property
    def on_cpu(self) -> bool:
        return self.device.startswith("cpu")

    def note_compute(self, tokens: int, compute_ms: float, bulk_tokens: int = 0) -> None:
        """Learn the worker's rate from a batch's result (see the comments for which teach)."""
        # compute_ms comes from a peer: a NaN would stick in the average and a denormal make
        # the rate infinite, which bulk_cap cannot turn into tokens (every dispatch then fails).
        if not compute_ms > 0:
            return
        rate = tokens / (compute_ms / 1000)
        if not math.isfinite(rate):
            return
        # A batch of n tokens measures n / (c + n / R) for a fixed cost c and a peak R: at
        # most R, whatever its size. So any batch may raise a known rate (an announced rate
        # measured beside a busy start would otherwise stay while only small batches came).
        if self.rate > 0.0 and rate > self.rate:
            self.rate = rate
        # Lowering it takes a batch whose rate is near R. A CPU worker's bulk comes in batches
        # its rate bounds (cpu_bulk_ms), under the token floor maybe: any with batch-lane work
        # teaches, or a rate too low would keep them too small to correct it; rate and cap
        # climb together to R x (bound - c): they settle, never shrink away. Otherwise a batch
        # under RATE_MIN_BATCH_TOKENS or half the budget, whichever is less (queries, mostly
        # c), does not: taken as the rate, it made admission in time refuse work the workers
        # finish well within its deadline.
        bounded = self.on_cpu and bulk_tokens > 0
        if tokens < min(RATE_MIN_BATCH_TOKENS, self.max_batch_tokens // 2) and not bounded:
            return
        # A live lane's batch, timed beside bulk, is not its rate; but a worker whose whole
        # budget fits its lane runs every batch there, and would never learn one.
        if tokens <= self.live_tokens < self.max_batch_tokens:
            return
        # The first batch that teaches leaves an announced rate as raised above, never lower: a
        # disturbance only ever makes a measure slow (the sweep beside a busy start, the first
        # batch run cold). Then a moving average: one slow batch (a graph capture, a noisy
        # neighbour) moves it a little.
        if self.rate == 0.0:
            self.rate = rate
        elif not self.rate_announced:
            self.rate = 0.8 * self.rate + 0.2 * rate
        self.rate_announced = False

    def bulk_cap(self, batches: float, live_ms: float) -> int:
        """Batch-lane tokens it may hold while live traffic is about: ``batches`` of its
        budget, and no more than ``live_ms`` of its compute once its rate is known."""
        cap = int(batches * self.max_batch_tokens)
        if self.rate > 0.0:
            cap = min(cap, max(1, int(self.rate * live_ms / 1000)))
        return cap


@dataclass
class Registry:
    """Workers by identity, by model; the catalog and tokenizers they announced."""

    workers: dict[bytes, WorkerState] = field(default_factory=dict)
    tokenizers: dict[str, bytes] = field(default_factory=dict)  # digest → tokenizer.json
    known_models: dict[str, ModelInfo] = field(default_factory=dict)  # announced, not forgotten
    _rr: int = 0

    def add(self, identity: bytes, ready: WorkerReady, now: float, liveness: int) -> WorkerState:
        state = WorkerState(
            identity=identity,
            name=ready.name,
            model=ready.model,
            max_batch_tokens=ready.max_batch_tokens,
            max_batch_requests=ready.max_batch_requests,
            credits=ready.credits,
            free=ready.credits,
            device=ready.device,
            last_heard=now,
            expiry_s=ready.heartbeat_ms / 1000 * liveness,
            progress_at=now,
            live_credits=ready.live_credits,
            live_tokens=ready.live_tokens,
            # Its own measure until its batches teach the broker one (0: not measured).
            rate=ready.tokens_per_s,
            rate_announced=ready.tokens_per_s > 0,
        )
        self.workers[identity] = state
        # The first of each stays: the caller refuses a card that conflicts with a known one
        # (and the digest is checked, so equal digests mean equal tokenizers).
        self.tokenizers.setdefault(ready.model.tokenizer_digest, ready.tokenizer_json)
        self.known_models.setdefault(ready.model.name, ready.model)
        return state

    def forget(self, model: str) -> None:
        """Drop a model's card (and its tokenizer, unless another model shares it)."""
        info = self.known_models.pop(model, None)
        if info is None:
            return
        digest = info.tokenizer_digest
        if all(m.tokenizer_digest != digest for m in self.known_models.values()):
            self.tokenizers.pop(digest, None)

    def remove(self, identity: bytes) -> WorkerState | None:
        return self.workers.pop(identity, None)

    def heard(self, identity: bytes, now: float) -> WorkerState | None:
        state = self.workers.get(identity)
        if state is not None:
            state.last_heard = now
        return state

    def silent(self, now: float) -> list[WorkerState]:
        return [w for w in self.workers.values() if now - w.last_heard > w.expiry_s]

    def resolve(self, name: str) -> str | None:
        """Canonical model name for a name or alias, among models ever announced."""
        if name in self.known_models:  # the common case, without a scan
            return name
        model = find_model(self.known_models.values(), name)
        return None if model is None else model.name

    def with_credit(self, model: str) -> list[WorkerState]:
        """Workers of ``model`` with a free credit, most free first, rotating among ties so
        equal workers share the load."""
        ready = [w for w in self.workers.values() if w.model.name == model and w.free > 0]
        if len(ready) > 1:
            self._rr = (self._rr + 1) % len(ready)
            ready = ready[self._rr :] + ready[: self._rr]
            ready.sort(key=lambda w: -w.free)
        return ready

    def count(self, model: str) -> int:
        return sum(1 for w in self.workers.values() if w.model.name == model)

    def drain_rate(self, model: str) -> float:
        """Tokens per second the model's workers compute together, from the rates their large
        batches ran at; a worker that has run none yet counts with the rate it measured at
        start (``WorkerReady.tokens_per_s``), so that admission in time holds from the first
        request of a fresh mesh; 0 while no worker of it has a rate."""
        return sum(w.rate for w in self.workers.values() if w.model.name == model)

    def catalog(self) -> list[ModelInfo]:
        """Models with at least one live worker, with their worker counts and the largest
        batch budget among those workers (what TEI's /info reports)."""
        live: dict[str, list[WorkerState]] = {}
        for w in self.workers.values():
            live.setdefault(w.model.name, []).append(w)
        out = []
        for name, workers in live.items():
            info = self.known_models[name]
            now = {
                "aliases": list(info.aliases),
                "workers": len(workers),
                "max_batch_tokens": max(w.max_batch_tokens for w in workers),
                "max_batch_requests": max(w.max_batch_requests for w in workers),
            }
            out.append(ModelInfo(**{**info.__dict__, **now}))
        return out

"""What the broker tells of itself on every Pong: queues by model and lane, counters of the work
done and of the batches formed, queue-wait histograms, and each worker's state.

The broker has no HTTP: ingresses ping it every heartbeat interval and export the Pong's
``BrokerStats`` at their ``/metrics`` and ``/health``, so nothing here is on a request's path
but two counter updates per batch (``dispatched``, ``completed``), kept flat for the loop.
Workers that left or were buried stay listed as ``down`` for a while (``DOWN_KEEP``,
``DOWN_FORGET_S``), so that a scrape or a health check after a crash can still tell which one
went and why; one that comes back under the same name replaces its entry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable

from mesh.broker.inflight import InFlight
from mesh.broker.queue import Queue, Slice
from mesh.broker.registry import Registry, WorkerState
from mesh.config import MODEL_FORGET_S
from proto_msgs import BrokerStats, Lane
from proto_msgs.stats import WAIT_BUCKETS_S, LaneStats, ModelStats, WorkerStats

DOWN_KEEP = 16  # gone workers listed at once (labels stay few); 4..64
DOWN_FORGET_S = MODEL_FORGET_S  # ... and for at most this long


class _ModelCounters:
    __slots__ = ("lanes", "batches", "batch_tokens", "batch_budget_tokens")

    def __init__(self) -> None:
        self.lanes = (_lane(), _lane())
        self.batches = 0
        self.batch_tokens = 0
        self.batch_budget_tokens = 0


def _lane() -> LaneStats:
    return LaneStats(wait_counts=[0] * (len(WAIT_BUCKETS_S) + 1))


class StatsBook:
    """Counters since the broker started, and the workers that went down lately."""

    def __init__(self) -> None:
        self._models: dict[str, _ModelCounters] = {}
        self._down: OrderedDict[str, tuple[WorkerStats, float]] = OrderedDict()

    def _model(self, model: str) -> _ModelCounters:
        counters = self._models.get(model)
        if counters is None:
            counters = self._models[model] = _ModelCounters()
        return counters

    def dispatched(self, model: str, slices: Iterable[Slice], tokens: int, budget: int,
                   now: float) -> None:  # fmt: skip
        """A batch of ``tokens`` went to a worker whose budget is ``budget``: count it, and
        each part's wait since its request arrived (first dispatches only)."""
        counters = self._model(model)
        counters.batches += 1
        counters.batch_tokens += tokens
        counters.batch_budget_tokens += budget
        for piece in slices:
            if piece.attempt != 1:
                continue  # a retry's wait is the failure's, not the queue's
            wait = max(0.0, now - piece.request.submitted_at)
            lane = counters.lanes[piece.request.lane]
            lane.wait_counts[bisect_left(WAIT_BUCKETS_S, wait)] += 1
            lane.wait_sum_s += wait

    def completed(self, worker: WorkerState, slices: Iterable[Slice], tokens: int) -> None:
        """A batch of ``worker`` came back with its result."""
        worker.batches_done += 1
        worker.tokens_done += tokens
        lanes = self._model(worker.model.name).lanes
        for piece in slices:
            lane = lanes[piece.request.lane]
            lane.sequences_done += piece.end - piece.start
            lane.tokens_done += piece.tokens

    def went_down(self, worker: WorkerState, why: str, now: float) -> None:
        entry = _worker_stats(worker, "down", 0, 0.0)
        entry.reason = why
        self._down[entry.id] = (entry, now)
        while len(self._down) > DOWN_KEEP:
            self._down.popitem(last=False)

    def came_up(self, worker: WorkerState) -> None:
        """A worker said READY: an entry of its name and model is no longer down."""
        for key, (entry, _) in list(self._down.items()):
            if entry.name == worker.name and entry.model == worker.model.name:
                del self._down[key]

    def snapshot(
        self, queue: Queue, registry: Registry, inflight: InFlight, dropped: int, now: float
    ) -> BrokerStats:
        models = set(queue.models()) | {w.model.name for w in registry.workers.values()}
        rates = {m: r for m in models if (r := registry.drain_rate(m)) > 0.0}
        return BrokerStats(
            queued_tokens={m: queue.queued_tokens(m) for m in models},
            queued_sequences={m: queue.queued_sequences(m) for m in models},
            workers={m: registry.count(m) for m in models},
            inflight_batches=len(inflight),
            dropped_frames=dropped,
            backlog_s={m: list(queue.backlog_s(m, rates[m])) for m in rates},
            drain_rate=rates,
            models={m: self._model_stats(m, queue, rates.get(m, 0.0)) for m in models},
            worker_list=self._workers(registry, inflight, now),
        )

    def _model_stats(self, model: str, queue: Queue, rate: float) -> ModelStats:
        counters = self._model(model)
        lanes = []
        for lane in Lane:
            done = counters.lanes[lane]
            lanes.append(
                LaneStats(
                    queued_sequences=queue.queued_sequences(model, lane),
                    queued_tokens=queue.queued_tokens(model, lane),
                    sequences_done=done.sequences_done,
                    tokens_done=done.tokens_done,
                    wait_counts=list(done.wait_counts),
                    wait_sum_s=done.wait_sum_s,
                )
            )
        queued = queue.queued_tokens(model)
        return ModelStats(
            lanes=lanes,
            batches=counters.batches,
            batch_tokens=counters.batch_tokens,
            batch_budget_tokens=counters.batch_budget_tokens,
            queued_s=queued / rate if rate > 0.0 else 0.0,
        )

    def _workers(self, registry: Registry, inflight: InFlight, now: float) -> list[WorkerStats]:
        out = []
        for worker in registry.workers.values():
            held = len(inflight.for_worker(worker.identity))
            out.append(
                _worker_stats(worker, "busy" if held else "up", held, now - worker.last_heard)
            )
        for key, (entry, when) in list(self._down.items()):
            if now - when > DOWN_FORGET_S:
                del self._down[key]
                continue
            entry.since_s = now - when
            out.append(entry)
        return out


def _worker_stats(worker: WorkerState, state: str, held: int, since_s: float) -> WorkerStats:
    return WorkerStats(
        id=worker.identity.hex(),
        name=worker.name,
        model=worker.model.name,
        device=worker.device,
        state=state,
        inflight_batches=held,
        credits=worker.credits,
        tokens_per_s=worker.rate,
        batches_done=worker.batches_done,
        tokens_done=worker.tokens_done,
        since_s=max(0.0, since_s),
    )

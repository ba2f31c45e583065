"""Batches handed to workers and not answered yet.

``InFlight`` holds each dispatched batch, with the plan that maps its result rows back to
requests, from dispatch until its result or error pops it. That makes delivery to workers
at-least-once: a second result for the same batch id, or one for a batch already taken back
from a dead worker, finds nothing, so duplicates are harmless. A dead or hung worker's batches
are removed in dispatch order and split by attempt count into work to requeue at the head of
the queue and work to fail.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from mesh.broker.batches import BatchPlan
from mesh.broker.queue import Slice
from mesh.config import MAX_ATTEMPTS


@dataclass(slots=True)
class InFlightBatch:
    """One batch a worker holds; its slices go back to the queue if the worker is lost."""

    batch_id: int
    worker: bytes  # routing identity of the worker holding it
    slices: list[Slice]  # each slice's attempt counts this dispatch
    dispatched_at: float
    deadline: float  # absolute: not back by then means the worker is hung
    bulk_tokens: int = 0  # of its tokens, those from the batch lane (capped while live)
    # The message sent and where each slice's rows land in the result; set by the broker
    # once the batch id exists. It lives here so a batch has one entry, popped once.
    plan: BatchPlan | None = None
    sent_at: float = 0.0  # time.perf_counter() just after the batch left, for per-hop timings

    @property
    def attempt(self) -> int:
        """The highest dispatch count among the batch's sequences."""
        return max((piece.attempt for piece in self.slices), default=0)

    @property
    def sequences(self) -> int:
        return sum(piece.end - piece.start for piece in self.slices)

    @property
    def tokens(self) -> int:
        return sum(piece.tokens for piece in self.slices)


class InFlight:
    """Dispatched batches by id and by worker."""

    def __init__(self, max_attempts: int = MAX_ATTEMPTS, first_id: int | None = None) -> None:
        self.max_attempts = max_attempts  # dispatches of one sequence before it is given up
        self._batches: dict[int, InFlightBatch] = {}
        self._by_worker: dict[bytes, dict[int, InFlightBatch]] = {}
        # A random start keeps a late result from a previous broker process (same workers, fresh
        # table) from matching a batch of this one.
        self._next_id = secrets.randbits(48) if first_id is None else first_id

    def __len__(self) -> int:
        return len(self._batches)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._batches

    def add(
        self,
        worker: bytes,
        slices: list[Slice],
        now: float,
        deadline: float,
        bulk_tokens: int = 0,
    ) -> InFlightBatch:
        """Record a batch sent to ``worker`` under a fresh batch id."""
        batch = InFlightBatch(self._next_id, worker, slices, now, deadline, bulk_tokens)
        self._next_id += 1
        self._batches[batch.batch_id] = batch
        self._by_worker.setdefault(worker, {})[batch.batch_id] = batch
        return batch

    def pop(self, batch_id: int, worker: bytes | None = None) -> InFlightBatch | None:
        """Take the batch a result answers; None for unknown or duplicate ids, or (when
        ``worker`` is given) for a batch held by another worker, which is left in place."""
        batch = self._batches.get(batch_id)
        if batch is None or (worker is not None and batch.worker != worker):
            return None
        del self._batches[batch_id]
        held = self._by_worker[batch.worker]
        del held[batch_id]
        if not held:
            del self._by_worker[batch.worker]
        return batch

    def for_worker(self, worker: bytes) -> list[InFlightBatch]:
        """The worker's batches in dispatch order."""
        return list(self._by_worker.get(worker, {}).values())

    def bulk_tokens(self, worker: bytes) -> int:
        """Batch-lane tokens ``worker`` holds now (a sum over its credits' batches)."""
        return sum(batch.bulk_tokens for batch in self._by_worker.get(worker, {}).values())

    def remove_worker(self, worker: bytes) -> list[InFlightBatch]:
        """Take back every batch of a dead or hung worker, in dispatch order, for requeue."""
        batches = list(self._by_worker.pop(worker, {}).values())
        for batch in batches:
            del self._batches[batch.batch_id]
        return batches

    def overdue(self, now: float) -> list[InFlightBatch]:
        """Batches past their deadline (left in place): their workers are hung.

        A scan, because the table holds workers x credits batches: a few hundred at most.
        """
        return [batch for batch in self._batches.values() if batch.deadline <= now]

    def split_retry(self, slices: Iterable[Slice]) -> tuple[list[Slice], list[Slice]]:
        """Split failed slices, order kept, into (requeue, give_up) by their attempt count.

        A slice already dispatched ``max_attempts`` times is given up: the caller fails its
        request (``Queue.fail_request``) with WORKER_FAILED, then requeues the rest.
        """
        requeue: list[Slice] = []
        give_up: list[Slice] = []
        for piece in slices:
            (give_up if piece.attempt >= self.max_attempts else requeue).append(piece)
        return requeue, give_up

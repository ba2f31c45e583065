"""What is out and not done yet: requests not completed, and batches handed to workers.

``RequestTable`` holds the live requests and counts the sequences each still owes; the queue
ends requests through it. ``InFlight`` holds each dispatched batch from dispatch until its
result or error pops it, which makes delivery to workers at-least-once: a second result for the
same batch id, or one for a batch already taken back from a dead worker, finds nothing, so
duplicates are harmless. A dead or hung worker's batches are removed in dispatch order and split
by attempt count into work to requeue at the head of the queue and work to fail.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mesh.config import MAX_ATTEMPTS

if TYPE_CHECKING:  # queue.py imports this module at run time
    from mesh.broker.queue import Request, RequestKey, Slice

DEADLINE_HEAP_SLACK = 1024  # ended requests the deadline heap may hold beyond 2x the live ones


class RequestTable:
    """Live requests by key, and how many of each one's sequences are not completed yet.

    Read it freely (``get``, ``in``, ``len``); ``add`` and ``forget`` belong to the Queue, which
    must release a request's queued tokens when it ends.
    """

    def __init__(self) -> None:
        self._live: dict[RequestKey, Request] = {}
        self._deadlines: list[tuple[float, int, Request]] = []  # heap; ended entries skipped
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def get(self, key: RequestKey) -> Request | None:
        return self._live.get(key)

    def add(self, request: Request) -> None:
        if request.key in self._live:
            raise ValueError(f"duplicate request key {request.key!r}")
        request.live = True
        request.outstanding = request.n_sequences
        self._live[request.key] = request
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, next(self._order), request))

    def forget(self, request: Request) -> None:
        request.live = False
        del self._live[request.key]
        if len(self._deadlines) > 2 * len(self._live) + DEADLINE_HEAP_SLACK:
            # Most requests end long before their deadline; don't hold them (and their
            # payloads) until it passes. Rebuilding drops at least half: O(1) amortized.
            self._deadlines = [entry for entry in self._deadlines if entry[2].live]
            heapq.heapify(self._deadlines)

    def complete(self, request: Request, n: int) -> bool:
        """Count ``n`` more sequences done; True (and forgotten) when it was the last of them."""
        if not request.live:
            return False
        if not 0 < n <= request.outstanding:
            raise ValueError(f"{n} sequences completed, {request.outstanding} outstanding")
        request.outstanding -= n
        if request.outstanding:
            return False
        self.forget(request)
        return True

    def past_deadline(self, now: float) -> list[Request]:
        """Live requests whose deadline is ``<= now``, oldest deadline first (not forgotten)."""
        due = []
        while self._deadlines and self._deadlines[0][0] <= now:
            request = heapq.heappop(self._deadlines)[2]
            if request.live:
                due.append(request)
        return due


@dataclass(slots=True)
class InFlightBatch:
    """One batch a worker holds; its slices go back to the queue if the worker is lost."""

    batch_id: int
    worker: bytes  # routing identity of the worker holding it
    slices: list[Slice]  # each slice's attempt counts this dispatch
    dispatched_at: float
    deadline: float  # absolute: not back by then means the worker is hung

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

    def add(self, worker: bytes, slices: list[Slice], now: float, deadline: float) -> InFlightBatch:
        """Record a batch sent to ``worker`` under a fresh batch id."""
        batch = InFlightBatch(self._next_id, worker, slices, now, deadline)
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

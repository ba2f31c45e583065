"""Requests the broker has accepted and not yet answered: the ``Request`` type and its table.

A request is live from ``Queue.submit`` until it ends (completed, cancelled, expired, refused,
failed or drained). ``RequestTable`` holds the live ones by key and counts the sequences each
still owes; only the Queue adds and forgets, so that a request's queued tokens are released
whenever it ends. Nothing here knows about lanes' order, batches or workers.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from proto_msgs import Lane

RequestKey = tuple[bytes, int]  # (ingress peer identity, correlation id)

DEADLINE_HEAP_SLACK = 1024  # ended requests the deadline heap may hold beyond 2x the live ones


@dataclass(eq=False, slots=True)
class Request:
    """One client request of ``len(lengths)`` sequences; ``payload`` is opaque to the queue."""

    key: RequestKey
    model: str
    lane: Lane
    lengths: np.ndarray  # int32 tokens per sequence, each >= 1
    deadline: float | None  # absolute, on the clock of ``now``
    submitted_at: float
    payload: object = None
    received_at: float = 0.0  # time.perf_counter() when the submit arrived, for per-hop timings
    # Bookkeeping owned by Queue and its RequestTable, never set by the caller. The prefix sums are a
    # Python list because ``bisect`` on it costs a tenth of ``np.searchsorted`` on tiny spans.
    offsets: list[int] = field(init=False, repr=False)  # offsets[i] = sum(lengths[:i])
    live: bool = field(init=False, default=False)
    outstanding: int = field(init=False, default=0)  # sequences not completed yet
    queued_tokens: int = field(init=False, default=0)
    queued_sequences: int = field(init=False, default=0)
    queued_spans: int = field(init=False, default=0)
    # Set when a batch holding it failed for its input: it is retried in batches of its own, so
    # a bad request fails alone and never takes its batch-mates with it.
    alone: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.lengths = np.asarray(self.lengths, dtype=np.int32)
        # Plain Python from here: numpy's per-call cost dominates for the usual short request.
        values = self.lengths.tolist()
        if self.lengths.ndim != 1 or not values or min(values) < 1:
            raise ValueError("a request needs at least one sequence, each of >= 1 token")
        self.lane = Lane(self.lane)
        self.offsets = list(itertools.accumulate(values, initial=0))

    @property
    def n_sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def total_tokens(self) -> int:
        return self.offsets[-1]


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

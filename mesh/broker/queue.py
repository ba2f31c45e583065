"""The broker's batching queue: pure, synchronous, the one owner of work waiting for a worker.

Items are sequences (a request of 100 texts is 100 items and may span batches), stored as spans
of one request's consecutive sequence indices ``[start, end)``. Each request keeps the prefix sums
of its token lengths, so cutting a span at a token budget is one binary search, never a loop over
sequences: the broker of a GPU host forms tens of thousands of sequences a second in Python.

Per model there are two lanes, INTERACTIVE and BATCH, each strictly first come first served.
Time never comes from a clock here: every method that needs it takes ``now``, so tests are exact.

Admission is measured in time as well as tokens: with the model's drain rate known (the sum of
its workers' compute rates, which the caller passes in), a request is refused when the work
queued ahead of it in its lane plus its own would not be done within its deadline (a request
alone in its lane: LONE_SLACK times its deadline). It would fail with 504 after waiting
anyway; a 429 now, with a Retry-After of the excess, lets the client back off or go elsewhere.
The token cap stays as the memory bound. Until a worker has run large batches, its rate is
the one it timed on a probe batch at start (``mesh.broker.registry``), so this holds from
the first request of a fresh mesh.

A request is live from ``submit`` until it ends: completed, cancelled, expired, refused (head
longer than a whole batch), failed (a batch gave up) or drained (its model lost every worker).
Ending forgets it at once with its queued tokens; its spans still in a lane are dropped when they
reach the head. The caller answers the client once for each ending this module reports.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from mesh import errors
from mesh.broker.requests import Request, RequestKey, RequestTable
from mesh.config import AGING_S, DEFAULT_REQUEST_TIMEOUT_S, LIVE_WINDOW_S
from proto_msgs import Lane

RATE_WINDOW_S = 1.0  # period over which the drain rate behind Retry-After is measured; 0.5..5
RETRY_AFTER_DEFAULT_S = 1.0  # Retry-After before any batch of the model was formed
RETRY_AFTER_MAX_S = 30.0  # a longer wait is better told as "try another broker"; 10..120
# A request alone in its lane is refused only when its own work, at the drain rate, would take
# this many times its time budget; 1.2..3 is reasonable (the rate may be a probe's estimate).
LONE_SLACK = 1.5
COMPACT_AFTER = 1024  # ended spans a lane holds before it is rebuilt without them


class Overloaded(errors.Overloaded):
    """Admission refused: the model's queued tokens would pass ``max_queued_tokens``."""

    def __init__(self, model: str, retry_after_s: float, why: str = "") -> None:
        why = f": {why}" if why else ""
        super().__init__(f"model {model!r} is overloaded{why}", retry_after_s=retry_after_s)


class RequestTooLarge(errors.TooLarge):
    """The request alone holds more tokens than a model may queue: no retry can admit it."""


class Slice(NamedTuple):
    """Sequences ``[start, end)`` of one request: a queued span, or one part of a batch."""

    request: Request
    start: int
    end: int
    attempt: int  # dispatches of these sequences so far (0 while never sent)

    @property
    def tokens(self) -> int:
        return self.request.offsets[self.end] - self.request.offsets[self.start]


@dataclass(slots=True)
class FormedBatch:
    """What one ``form_batch`` call decided; the caller answers ``expired`` and ``refused``."""

    slices: list[Slice] = field(default_factory=list)  # batch order; attempt counts this dispatch
    expired: list[Request] = field(default_factory=list)  # deadline passed: answer DEADLINE
    refused: list[Request] = field(default_factory=list)  # head alone over budget: TOO_LARGE
    tokens: int = 0
    sequences: int = 0
    bulk_tokens: int = 0  # of them, from the batch lane
    alone: Request | None = None  # the one request this batch holds, when it must go alone


class _ModelQueue:
    __slots__ = ("lanes", "tokens", "sequences", "dead_spans", "rate", "window", "live_at")

    def __init__(self) -> None:
        self.lanes: tuple[deque[Slice], deque[Slice]] = (deque(), deque())
        self.tokens = [0, 0]  # live queued tokens per lane
        self.sequences = [0, 0]
        self.dead_spans = [0, 0]  # spans of ended requests still waiting to reach a head
        self.rate = 0.0  # tokens dispatched per second, measured over the last window
        self.window: tuple[float, int] | None = None  # (start, tokens dispatched since)
        self.live_at = -math.inf  # when interactive work was last submitted

    def note_dispatch(self, tokens: int, now: float) -> None:
        start, dispatched = self.window or (now, 0)
        if now - start >= RATE_WINDOW_S:
            self.rate = dispatched / (now - start)
            start, dispatched = now, 0
        self.window = (start, dispatched + tokens)

    def retry_after(self, excess_tokens: int) -> float:
        if self.rate <= 0.0:
            return RETRY_AFTER_DEFAULT_S
        return min(RETRY_AFTER_MAX_S, max(0.1, excess_tokens / self.rate))


class Queue:
    """Per model and lane FCFS queues of sequences, cut into batches at dispatch time."""

    def __init__(
        self,
        max_queued_tokens: int,
        aging_s: float = AGING_S,
        live_window_s: float = LIVE_WINDOW_S,
        max_wait_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self.max_queued_tokens = max_queued_tokens  # per model; requeued work may exceed it
        self.max_wait_s = max_wait_s  # the time budget of a request that carries no deadline
        self.aging_s = aging_s
        self.live_window_s = live_window_s
        self.requests = RequestTable()
        self._models: dict[str, _ModelQueue] = {}

    def submit(self, request: Request, now: float, drain_rate: float = 0.0) -> None:
        """Admit a request at the tail of its lane, or raise Overloaded / RequestTooLarge.

        ``drain_rate``: tokens per second the model's workers compute (0 = not known yet, then
        only the token cap applies); see :meth:`backlog_s` for the time rule."""
        if request.key in self.requests:
            raise ValueError(f"duplicate request key {request.key!r}")
        total = request.total_tokens
        if total > self.max_queued_tokens:
            raise RequestTooLarge(f"{total} tokens; at most {self.max_queued_tokens} may queue")
        mq = self._models.get(request.model)
        if mq is None:
            mq = self._models[request.model] = _ModelQueue()
        excess = sum(mq.tokens) + total - self.max_queued_tokens
        if excess > 0:
            raise Overloaded(request.model, mq.retry_after(excess))
        if drain_rate > 0.0:
            self._admit_in_time(request, mq, total, now, drain_rate)
        self.requests.add(request)
        if request.lane == Lane.INTERACTIVE:
            mq.live_at = now
        mq.lanes[request.lane].append(Slice(request, 0, request.n_sequences, 0))
        self._count(mq, request, request.n_sequences, total, 1)

    def _admit_in_time(
        self, request: Request, mq: _ModelQueue, total: int, now: float, drain_rate: float
    ) -> None:
        """Overloaded when the work ahead of ``request`` in its lane plus its own would end
        past its deadline at ``drain_rate``. A request alone in its lane gets the benefit of
        the doubt (the rate is an estimate, and its own deadline still bounds it): it is
        refused only past LONE_SLACK times its time budget, where it would surely end in 504
        after holding the workers all that time."""
        ahead = _ahead(mq, request.lane)
        budget = request.deadline - now if request.deadline is not None else self.max_wait_s
        if ahead == 0:
            budget *= LONE_SLACK
        need = (ahead + total) / drain_rate
        if need <= budget:
            return
        if ahead:
            why = f"this request would end about {need:.0f}s from now, past its deadline"
        else:
            why = (f"this request alone is about {need:.0f}s of work at its workers' rate, far "
                   "past its deadline; send fewer inputs per request")  # fmt: skip
        raise Overloaded(request.model, min(RETRY_AFTER_MAX_S, max(0.1, need - budget)), why)

    def cancel(self, key: RequestKey) -> bool:
        """End a live request at the client's wish; False if it already ended or never was."""
        request = self.requests.get(key)
        if request is None:
            return False
        self._end(request)
        return True

    def fail_request(self, request: Request) -> bool:
        """End a request one of whose batches failed for good; False if it had already ended."""
        if not request.live:
            return False
        self._end(request)
        return True

    def complete(self, request: Request, n: int) -> bool:
        """Count ``n`` dispatched sequences of ``request`` done; True when it is complete.

        Takes the Request of the returned slice, not its key, so a late result of an ended
        request can never count toward a new request that reuses the key.
        """
        if request.live and n > request.outstanding - request.queued_sequences:
            raise ValueError(f"{n} sequences completed but fewer are in flight")
        return self.requests.complete(request, n)

    def expire(self, now: float) -> list[Request]:
        """End every live request whose deadline passed, queued or in flight; answer each."""
        expired = self.requests.past_deadline(now)
        for request in expired:
            self._end(request)
        return expired

    def drain_model(self, model: str) -> list[Request]:
        """End every live request with queued work on ``model`` (its last worker is gone)."""
        mq = self._models.get(model)
        if mq is None:
            return []
        drained = [span.request for queue in mq.lanes for span in queue if span.request.live]
        drained = list(dict.fromkeys(drained))  # a request may hold several spans
        for request in drained:
            self._end(request)
        for lane in Lane:
            mq.lanes[lane].clear()
            mq.dead_spans[lane] = 0
        return drained

    def forget_model(self, model: str) -> list[Request]:
        """Drain ``model`` (see ``drain_model``) and drop its queues: it is no longer served."""
        drained = self.drain_model(model)
        self._models.pop(model, None)
        return drained

    def requeue_front(self, slices: list[Slice]) -> None:
        """Put a failed batch's slices back at the head of their lanes, in their order.

        For several batches, pass their slices concatenated oldest dispatch first. Slices of
        ended requests are dropped; the attempt count travels with each slice.
        """
        for piece in reversed(slices):
            request = piece.request
            if request.live:
                mq = self._models[request.model]
                mq.lanes[request.lane].appendleft(piece)
                self._count(mq, request, piece.end - piece.start, piece.tokens, 1)

    def isolate(self, slices: list[Slice]) -> None:
        """Requeue a batch that failed for its input at the head, each request to be retried
        in a batch of its own: only the request that fails again alone is at fault."""
        for piece in slices:
            piece.request.alone = True
        self.requeue_front(slices)

    def form_batch(
        self,
        model: str,
        max_batch_tokens: int,
        max_batch_requests: int,
        now: float,
        bulk_cap: int | None = None,
        bulk_held: int = 0,
        bulk_split: int = 1,
        last_credit: bool = False,
        capped: bool = False,
    ) -> FormedBatch | None:
        """Cut the next batch for a worker of ``model``; None when there is nothing to report.

        Interactive work first, then the batch lane fills what is left. A batch-lane head that
        has waited ``aging_s`` goes first instead, but takes at most half the budget while
        interactive work waits, so that neither lane can starve the other.

        While the model is live (see ``live``), the batch-lane tokens the worker would hold,
        ``bulk_held`` already plus this batch's, stay within ``bulk_cap`` (when given), so a
        query arriving next waits behind about one batch, not behind every credit's worth.
        The batch lane still gets ``bulk_cap`` in flight per worker: it slows, never starves.
        That cap is cut into ``bulk_split`` batches of at most ``bulk_cap / bulk_split``
        tokens each (the broker passes the worker's credits less one, so one credit stays
        free for the query): a query then waits behind the same tokens, but a worker with
        three credits holds a second bulk batch to start while the first one's reply
        travels, instead of idling for that round trip (measured: with the cap whole, bulk
        kept 0.79-0.84 of its solo rate). And while live, a worker's ``last_credit`` (the
        broker says so only for workers of several credits) takes no more bulk once the
        worker holds some: batches of bulk smaller than the cap would otherwise fill every
        credit, and a query arriving then waited in the broker for one to come back (3.5 ms
        mean on the H200). A worker holding no bulk may give it even its last credit, or
        queries overlapping at every reply would keep bulk out for good.

        ``capped``: the cap (and the free last credit) applies whether the model is live or
        not (the broker says so for a CPU worker, whose batches are slow enough that a query
        arriving after a quiet spell would otherwise wait for a whole one).
        """
        if max_batch_tokens < 1 or max_batch_requests < 1:
            raise ValueError("a batch budget needs at least one token and one sequence")
        mq = self._models.get(model)
        if mq is None:
            return None
        room = max_batch_tokens  # for batch-lane tokens in this batch
        if bulk_cap is not None and (capped or self._live(mq, now)):
            share = -(-bulk_cap // max(1, bulk_split))  # ceil: the split never loses a token
            keep_free = last_credit and bulk_held > 0
            room = 0 if keep_free else min(room, bulk_cap - bulk_held, share)
        batch = FormedBatch()
        head = self._head(mq, Lane.BATCH, now, batch)
        aged = head is not None and now - head.request.submitted_at >= self.aging_s
        if room > 0 and aged and self._head(mq, Lane.INTERACTIVE, now, batch) is not None:
            half = (min(room, max_batch_tokens // 2), max(1, max_batch_requests // 2))
            self._take(mq, Lane.BATCH, *half, max_batch_tokens, now, batch)
        self._take(
            mq, Lane.INTERACTIVE, max_batch_tokens, max_batch_requests, max_batch_tokens, now, batch
        )
        if room > batch.bulk_tokens:
            limit = min(max_batch_tokens, batch.tokens + room - batch.bulk_tokens)
            self._take(mq, Lane.BATCH, limit, max_batch_requests, max_batch_tokens, now, batch)
        return self._formed(mq, batch, now)

    def form_lane_batch(
        self,
        model: str,
        max_batch_tokens: int,
        max_batch_requests: int,
        now: float,
        live_tokens: int,
        bulk_allowed: bool,
    ) -> FormedBatch | None:
        """Cut the next batch for a worker with a live lane (``WorkerReady.live_credits``),
        which runs a batch of at most ``live_tokens`` beside the bulk batches it holds, on a
        CUDA stream of its own: a query there does not wait behind bulk, so the lanes never
        share a batch and no cap on held bulk is needed.

        Interactive work goes first. On the credit kept for the lane (``bulk_allowed`` False:
        the worker has no other free) it goes in batches of at most ``live_tokens`` (a longer
        head goes alone, and the worker runs it on its bulk path); on another credit in full
        batches, so that a flood of small requests on the interactive lane (what a client
        sends by default) still fills the device through the compute thread instead of
        running as lane-sized batches one after another; a lone query is small either way,
        and the worker runs it on the lane. Batch-lane work takes the whole budget, only when
        ``bulk_allowed`` (the caller: the worker has a credit free beyond the ones it keeps
        for its live lane). A batch-lane head that has waited ``aging_s`` goes before waiting
        interactive work, so a flood of queries cannot starve bulk either.
        """
        if max_batch_tokens < 1 or max_batch_requests < 1 or live_tokens < 1:
            raise ValueError("a batch budget needs at least one token and one sequence")
        mq = self._models.get(model)
        if mq is None:
            return None
        batch = FormedBatch()
        head = self._head(mq, Lane.BATCH, now, batch) if bulk_allowed else None
        aged = head is not None and now - head.request.submitted_at >= self.aging_s
        if not aged:
            cut = max_batch_tokens if bulk_allowed else min(live_tokens, max_batch_tokens)
            self._take(mq, Lane.INTERACTIVE, cut, max_batch_requests, max_batch_tokens, now, batch)
        if not batch.slices and bulk_allowed:
            self._take(
                mq, Lane.BATCH, max_batch_tokens, max_batch_requests, max_batch_tokens, now, batch
            )
        return self._formed(mq, batch, now)

    @staticmethod
    def _formed(mq: _ModelQueue, batch: FormedBatch, now: float) -> FormedBatch | None:
        if batch.tokens:
            mq.note_dispatch(batch.tokens, now)
        return batch if batch.slices or batch.expired or batch.refused else None

    def live(self, model: str, now: float) -> bool:
        """Interactive work of ``model`` waits, or came within the last ``live_window_s``."""
        mq = self._models.get(model)
        return mq is not None and self._live(mq, now)

    def _live(self, mq: _ModelQueue, now: float) -> bool:
        return bool(mq.sequences[Lane.INTERACTIVE]) or now - mq.live_at < self.live_window_s

    def _take(
        self,
        mq: _ModelQueue,
        lane: Lane,
        max_tokens: int,
        max_sequences: int,
        budget: int,
        now: float,
        batch: FormedBatch,
    ) -> None:
        """Move sequences from the head of ``lane`` into ``batch`` until one does not fit."""
        queue = mq.lanes[lane]
        while batch.sequences < max_sequences:
            span = self._head(mq, lane, now, batch)
            if span is None:
                return
            request, start, end, attempt = span
            suspect = request.alone or batch.alone is not None
            if suspect and batch.sequences and batch.alone is not request:
                return  # a request under suspicion shares its batch with no other
            offsets = request.offsets
            base = offsets[start]
            # The largest stop with offsets[stop] - base <= room, within the sequence cap.
            last = min(end, start + max_sequences - batch.sequences)
            stop = bisect_right(offsets, base + max_tokens - batch.tokens, start, last + 1) - 1
            if stop <= start:
                if batch.sequences:
                    return  # strict FCFS: the head waits for the next batch, nothing skips it
                if offsets[start + 1] - base > budget:
                    self._end(request)  # it would stall the lane forever
                    batch.refused.append(request)
                    continue
                stop = start + 1  # a reduced share still takes the head of an empty batch
            tokens = offsets[stop] - base
            batch.slices.append(Slice(request, start, stop, attempt + 1))
            if request.alone:
                batch.alone = request
            if lane == Lane.BATCH:
                batch.bulk_tokens += tokens
            batch.tokens += tokens
            batch.sequences += stop - start
            if stop < end:
                queue[0] = Slice(request, stop, end, attempt)
                self._count(mq, request, start - stop, -tokens, 0)
                return
            queue.popleft()
            self._count(mq, request, start - stop, -tokens, -1)

    def _head(self, mq: _ModelQueue, lane: Lane, now: float, batch: FormedBatch) -> Slice | None:
        """The live head span of ``lane``, after dropping ended and expiring what is overdue."""
        queue = mq.lanes[lane]
        while queue:
            span = queue[0]
            request = span.request
            if not request.live:
                queue.popleft()
                mq.dead_spans[lane] -= 1
            elif request.deadline is not None and request.deadline <= now:
                self._end(request)
                batch.expired.append(request)
            else:
                return span
        return None

    def _count(
        self, mq: _ModelQueue, request: Request, sequences: int, tokens: int, spans: int
    ) -> None:
        request.queued_sequences += sequences
        request.queued_tokens += tokens
        request.queued_spans += spans
        mq.sequences[request.lane] += sequences
        mq.tokens[request.lane] += tokens

    def _end(self, request: Request) -> None:
        """Forget a request and its queued tokens now; its spans drop when they reach a head."""
        self.requests.forget(request)
        mq = self._models[request.model]
        lane = request.lane
        mq.dead_spans[lane] += request.queued_spans
        self._count(mq, request, -request.queued_sequences, -request.queued_tokens, 0)
        request.queued_spans = 0
        queue = mq.lanes[lane]
        if mq.dead_spans[lane] >= COMPACT_AFTER and 2 * mq.dead_spans[lane] > len(queue):
            # Ended spans wait for a head, and a model without workers never serves one.
            live = [span for span in queue if span.request.live]
            queue.clear()
            queue.extend(live)
            mq.dead_spans[lane] = 0

    def queued_tokens(self, model: str, lane: Lane | None = None) -> int:
        mq = self._models.get(model)
        if mq is None:
            return 0
        return sum(mq.tokens) if lane is None else mq.tokens[lane]

    def backlog_s(self, model: str, drain_rate: float) -> tuple[float, float]:
        """Seconds of queued work ahead of a new (interactive, batch) request of ``model`` at
        ``drain_rate`` tokens/s; (0, 0) while the rate is unknown. An interactive request waits
        only behind the interactive lane; a batch one behind both. Ingresses get these on every
        Pong and refuse, before tokenizing, what the broker would refuse."""
        mq = self._models.get(model)
        if mq is None or drain_rate <= 0.0:
            return 0.0, 0.0
        return (
            _ahead(mq, Lane.INTERACTIVE) / drain_rate,
            _ahead(mq, Lane.BATCH) / drain_rate,
        )

    def queued_sequences(self, model: str, lane: Lane | None = None) -> int:
        mq = self._models.get(model)
        if mq is None:
            return 0
        return sum(mq.sequences) if lane is None else mq.sequences[lane]

    def depth(self) -> int:
        """Live queued sequences over all models."""
        return sum(sum(mq.sequences) for mq in self._models.values())

    def models(self) -> list[str]:
        """Every model that ever had a request submitted."""
        return list(self._models)


def _ahead(mq: _ModelQueue, lane: Lane) -> int:
    """Queued tokens a new request of ``lane`` waits behind (dispatch takes interactive first)."""
    return mq.tokens[Lane.INTERACTIVE] if lane == Lane.INTERACTIVE else sum(mq.tokens)

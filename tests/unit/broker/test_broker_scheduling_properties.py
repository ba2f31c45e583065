"""Random runs of the broker's scheduling core against a sequence-by-sequence reference model.

The reference keeps, per model and lane, the exact order in which queued sequences must leave
(submitted at the tail, requeued at the head), and how every request ended. The real queue must
hand out exactly a prefix of that order, within budget, and account for every sequence once.
"""

from __future__ import annotations

from collections import defaultdict

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mesh.broker.inflight import InFlight
from mesh.broker.queue import Lane, Overloaded, Queue, Request, RequestTooLarge

MODELS = ("m0", "m1")
WORKERS = (b"w0", b"w1", b"w2")
MAX_QUEUED_TOKENS = 400
AGING_S = 1.0
BATCH_TIMEOUT_S = 3.0
MAX_ATTEMPTS = 2

ENDINGS = {"completed", "cancelled", "expired", "refused", "given_up", "unavailable"}


class SchedulingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = Queue(MAX_QUEUED_TOKENS, aging_s=AGING_S)
        self.inflight = InFlight(max_attempts=MAX_ATTEMPTS, first_id=1)
        self.now = 0.0
        self.cids = 0
        self.admitted: list[Request] = []
        self.ended: dict[int, str] = {}  # cid -> how it ended, set exactly once
        self.rejected = 0
        # (model, lane) -> [(request, sequence index, dispatches so far)] in the order owed.
        self.owed: dict[tuple[str, Lane], list[tuple[Request, int, int]]] = defaultdict(list)
        self.delivered: set[tuple[int, int]] = set()
        self.answered_batches: list[int] = []

    def end(self, request: Request, how: str) -> None:
        cid = request.key[1]
        assert cid not in self.ended, f"request {cid} ended twice: {self.ended[cid]} and {how}"
        assert not request.live
        self.ended[cid] = how

    def live_owed(self, model: str, lane: Lane) -> list[tuple[Request, int, int]]:
        owed = [entry for entry in self.owed[(model, lane)] if entry[0].live]
        self.owed[(model, lane)] = owed
        return owed

    def live_head(self, model: str, lane: Lane) -> tuple[Request, int] | None:
        """The first owed sequence of the lane that the queue may still send."""
        for request, i, _ in self.live_owed(model, lane):
            if request.deadline is None or request.deadline > self.now:
                return request, i
        return None

    @rule(
        model=st.sampled_from(MODELS),
        lane=st.sampled_from(Lane),
        lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
        timeout=st.none() | st.floats(0.1, 4.0),
    )
    def submit(self, model, lane, lengths, timeout) -> None:
        self.cids += 1
        deadline = None if timeout is None else self.now + timeout
        request = Request((b"i", self.cids), model, lane, lengths, deadline, self.now)
        queued = self.queue.queued_tokens(model)
        try:
            self.queue.submit(request, self.now)
        except Overloaded as error:
            assert queued + sum(lengths) > MAX_QUEUED_TOKENS and error.retry_after_s > 0
            self.rejected += 1
            return
        except RequestTooLarge:
            assert sum(lengths) > MAX_QUEUED_TOKENS
            self.rejected += 1
            return
        self.admitted.append(request)
        self.owed[(model, lane)].extend((request, i, 0) for i in range(len(lengths)))

    @rule(pick=st.integers(0, 10**6))
    def submit_a_duplicate_key(self, pick) -> None:
        live = [request for request in self.admitted if request.live]
        if live:
            original = live[pick % len(live)]
            copy = Request(original.key, original.model, original.lane, [1], None, self.now)
            try:
                self.queue.submit(copy, self.now)
            except ValueError:
                return
            raise AssertionError("a duplicate key was admitted")

    @rule(pick=st.integers(0, 10**6))
    def cancel(self, pick) -> None:
        if self.admitted and pick % 3 == 0:  # a third as often as the other rules
            request = self.admitted[pick % len(self.admitted)]
            was_live = request.live
            assert self.queue.cancel(request.key) == was_live
            if was_live:
                self.end(request, "cancelled")

    @rule(
        model=st.sampled_from(MODELS),
        budget=st.integers(8, 120),
        cap=st.integers(1, 12),
        worker=st.sampled_from(WORKERS),
        bulk_cap=st.none() | st.integers(1, 150),
        split=st.integers(1, 3),
        last=st.booleans(),
    )
    def form_batch(self, model, budget, cap, worker, bulk_cap, split, last) -> None:
        self.form(model, budget, cap, worker, bulk_cap, split, last)

    def form(
        self,
        model: str,
        budget: int,
        cap: int,
        worker: bytes,
        bulk_cap=None,
        split: int = 1,
        last: bool = False,
    ) -> None:
        aged, waiting = self.live_head(model, Lane.BATCH), self.live_head(model, Lane.INTERACTIVE)
        if aged is None or waiting is None or self.now - aged[0].submitted_at < AGING_S:
            aged = None
        held = self.inflight.bulk_tokens(worker)
        capped = bulk_cap is not None and self.queue.live(model, self.now)
        share = -(-bulk_cap // split) if capped else budget
        room = min(budget, bulk_cap - held, share) if capped else budget
        kept_free = capped and last and held > 0  # the last credit stays the queries'
        if kept_free:
            room = 0
        batch = self.queue.form_batch(model, budget, cap, self.now, bulk_cap, held, split, last)
        if batch is None:
            if not capped or room > 0:
                assert all(self.live_head(model, lane) is None for lane in Lane)
            return
        for request in batch.expired:
            assert request.deadline is not None and request.deadline <= self.now
            self.end(request, "expired")
        for request in batch.refused:
            self.end(request, "refused")
        assert batch.tokens == sum(piece.tokens for piece in batch.slices) <= budget
        assert batch.sequences == sum(p.end - p.start for p in batch.slices) <= cap
        bulk = [p for p in batch.slices if p.request.lane == Lane.BATCH]
        assert batch.bulk_tokens == sum(p.tokens for p in bulk)
        assert not (kept_free and bulk), "a kept-free last credit took bulk"
        if capped:
            # Over the cap only by one head sequence that had to start an empty share.
            one = sum(p.end - p.start for p in bulk) == 1 and held < bulk_cap
            within = held + batch.bulk_tokens <= bulk_cap and batch.bulk_tokens <= share
            assert not batch.bulk_tokens or within or one, "bulk held within the cap"
        if aged is not None and aged[0].live and room > 0:
            assert batch.slices[0].request is aged[0], "an aged batch-lane head goes first"
            # ... but it takes at most half, so interactive work is not starved in turn.
            aged_share = max(min(room, budget // 2), int(aged[0].lengths[aged[1]]))
            fits = int(waiting[0].lengths[waiting[1]]) <= budget - aged_share
            if waiting[0].live and fits and not waiting[0].alone and batch.alone is None:
                assert cap < 2 or any(p.request is waiting[0] for p in batch.slices)
        for lane in Lane:
            lane_room = room - batch.bulk_tokens if lane == Lane.BATCH else budget
            self.check_lane_took_its_owed_prefix(model, lane, batch, budget, cap, lane_room)
        if batch.slices:
            deadline = self.now + BATCH_TIMEOUT_S
            self.inflight.add(worker, batch.slices, self.now, deadline, batch.bulk_tokens)
        else:
            assert batch.expired or batch.refused

    def check_lane_took_its_owed_prefix(self, model, lane, batch, budget, cap, room) -> None:
        owed = self.live_owed(model, lane)
        taken = [p for p in batch.slices if p.request.lane == lane]
        sent = [(p.request, i, p.attempt) for p in taken for i in range(p.start, p.end)]
        assert [(r, i, a + 1) for r, i, a in owed[: len(sent)]] == sent, "FCFS within a lane"
        for request, _, _ in sent:
            assert request.live and (request.deadline is None or request.deadline > self.now)
        del owed[: len(sent)]
        if owed and batch.alone is not None:
            assert all(p.request is batch.alone for p in batch.slices), "isolated means alone"
        elif owed and owed[0][0].alone:
            assert batch.sequences > 0, "an isolated head goes in the next empty batch"
        elif owed and batch.sequences < cap:
            # The batch is full: the lane's head is live and would not fit in what is left
            # (of the budget, or of the bulk a worker may hold while live traffic is about).
            request, i, _ = owed[0]
            assert request.deadline is None or request.deadline > self.now
            length = int(request.lengths[i])
            assert length > budget - batch.tokens or length > room
            assert batch.sequences > 0 or room <= 0, "a head over the budget is refused"

    @rule(pick=st.integers(0, 10**6))
    def deliver_a_result(self, pick) -> None:
        if not len(self.inflight):
            return
        ids = sorted(self.inflight._batches)
        batch = self.inflight.pop(ids[pick % len(ids)])
        assert batch is not None
        self.answered_batches.append(batch.batch_id)
        for piece in batch.slices:
            request = piece.request
            if not request.live:
                continue  # ended while in flight: the server drops the result
            for i in range(piece.start, piece.end):
                assert (request.key[1], i) not in self.delivered, "sequence delivered twice"
                self.delivered.add((request.key[1], i))
            if self.queue.complete(request, piece.end - piece.start):
                assert all(
                    (request.key[1], i) in self.delivered for i in range(len(request.lengths))
                )
                self.end(request, "completed")

    @rule(pick=st.integers(0, 10**6))
    def deliver_a_duplicate_result(self, pick) -> None:
        if self.answered_batches:
            batch_id = self.answered_batches[pick % len(self.answered_batches)]
            assert self.inflight.pop(batch_id) is None

    @rule(worker=st.sampled_from(WORKERS))
    def lose_a_worker(self, worker) -> None:
        lost = self.inflight.remove_worker(worker)
        assert [b.batch_id for b in lost] == sorted(b.batch_id for b in lost)
        self.retry_or_give_up(lost)

    @rule(pick=st.integers(0, 10**6))
    def a_batch_fails(self, pick) -> None:
        if len(self.inflight):
            ids = sorted(self.inflight._batches)
            self.retry_or_give_up([self.inflight.pop(ids[pick % len(ids)])])

    @rule(pick=st.integers(0, 10**6))
    def a_batch_fails_for_its_input(self, pick) -> None:
        if len(self.inflight):
            ids = sorted(self.inflight._batches)
            self.retry_or_give_up([self.inflight.pop(ids[pick % len(ids)])], isolate=True)

    def retry_or_give_up(self, lost, isolate: bool = False) -> None:
        requeue, give_up = self.inflight.split_retry(p for b in lost for p in b.slices)
        for piece in give_up:
            assert piece.attempt >= MAX_ATTEMPTS
            if self.queue.fail_request(piece.request):
                self.end(piece.request, "given_up")
        if isolate:
            self.queue.isolate(requeue)
        else:
            self.queue.requeue_front(requeue)
        front: dict[tuple[str, Lane], list] = defaultdict(list)
        for p in requeue:
            if p.request.live:
                key = (p.request.model, p.request.lane)
                front[key].extend((p.request, i, p.attempt) for i in range(p.start, p.end))
        for key, entries in front.items():
            self.owed[key] = entries + self.owed[key]

    @rule(model=st.sampled_from(MODELS), pick=st.integers(0, 10**6))
    def a_model_loses_its_last_worker(self, model, pick) -> None:
        if pick % 4:  # a quarter as often as the other rules
            return
        waiting = {r for lane in Lane for r, _, _ in self.live_owed(model, lane)}
        drained = self.queue.drain_model(model)
        assert len(drained) == len(set(drained)) and set(drained) == waiting
        for request in drained:
            self.end(request, "unavailable")

    @rule(seconds=st.floats(0.0, 1.5))
    def time_passes(self, seconds) -> None:
        self.now += seconds

    @rule()
    def expire(self) -> None:
        for request in self.queue.expire(self.now):
            assert request.deadline is not None and request.deadline <= self.now
            self.end(request, "expired")
        for request in self.admitted:
            if request.live:
                assert request.deadline is None or request.deadline > self.now

    @rule()
    def hung_workers_are_lost(self) -> None:
        for worker in {batch.worker for batch in self.inflight.overdue(self.now)}:
            self.lose_a_worker(worker)

    @invariant()
    def queued_counts_equal_the_live_owed_sequences(self) -> None:
        depth = 0
        for model in MODELS:
            for lane in Lane:
                owed = self.live_owed(model, lane)
                tokens = sum(int(request.lengths[i]) for request, i, _ in owed)
                assert self.queue.queued_tokens(model, lane) == tokens
                assert self.queue.queued_sequences(model, lane) == len(owed)
                depth += len(owed)
        assert self.queue.depth() == depth

    @invariant()
    def live_requests_are_exactly_those_not_ended(self) -> None:
        live = [r for r in self.admitted if r.key[1] not in self.ended]
        assert all(r.live and self.queue.requests.get(r.key) is r for r in live)
        assert len(self.queue.requests) == len(live)
        for request in live:
            done = sum((request.key[1], i) in self.delivered for i in range(len(request.lengths)))
            assert request.outstanding == len(request.lengths) - done

    def teardown(self) -> None:
        """Serve everything left: every admitted request must end exactly once."""
        for _ in range(1000):
            for model in MODELS:
                self.form(model, 10**6, 10**6, WORKERS[0])
            while len(self.inflight):
                self.deliver_a_result(0)
            if self.queue.depth() == 0:
                break
        assert self.queue.depth() == 0 and len(self.queue.requests) == 0
        assert {r.key[1] for r in self.admitted} == set(self.ended)
        assert set(self.ended.values()) <= ENDINGS
        assert len(self.admitted) + self.rejected == self.cids


TestScheduling = SchedulingMachine.TestCase
TestScheduling.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)

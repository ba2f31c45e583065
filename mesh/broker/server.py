"""The broker process: two ROUTER sockets and one loop that owns both.

Frontend (ingress DEALERs): SUBMIT, CANCEL, CATALOG, TOKENIZER, PING. Backend (worker DEALERs):
READY, HEARTBEAT, BATCH_RESULT, BATCH_ERROR, DISCONNECT. The queue algorithm lives in
``mesh.broker.queue`` and the dispatched batches in ``mesh.broker.inflight``; this module only
moves messages between them and the sockets, and keeps time.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from mesh.broker.batches import plan_batch, result_chunks
from mesh.broker.inflight import InFlight, InFlightBatch
from mesh.broker.links import LinkWatch
from mesh.broker.queue import FormedBatch, Overloaded, Queue, Request, RequestTooLarge
from mesh.broker.registry import Registry, WorkerState
from mesh.broker.stats import StatsBook
from mesh.broker.trust import PeerWarnings, card_differences
from mesh.config import (
    AGING_S,
    BATCH_TIMEOUT_S,
    CPU_BULK_MS,
    HANG_S,
    LIVE_BULK_BATCHES,
    LIVE_BULK_MS,
    LIVE_WINDOW_S,
    MAX_ATTEMPTS,
    MAX_QUEUED_TOKENS,
    MODEL_FORGET_S,
    Liveness,
)
from mesh.transport import send_frames, waiting
from proto_msgs import (
    BatchError,
    BatchResult,
    BrokerStats,
    CancelRequest,
    CatalogReply,
    CatalogRequest,
    Disconnect,
    ErrorCode,
    Heartbeat,
    Message,
    Ping,
    Pong,
    ProtocolError,
    RequestError,
    SubmitRequest,
    TokenizerReply,
    TokenizerRequest,
    WorkerReady,
    decode,
    encode,
)
from proto_msgs.checks import submit_problem

log = logging.getLogger("embedmesh.broker")

# A batch error with one of these codes may be one request's fault, so a batch of several is
# retried request by request; others (an expired batch) concern the batch, not its inputs.
ISOLATED_CODES = frozenset({ErrorCode.INVALID_INPUT, ErrorCode.TOO_LARGE, ErrorCode.INTERNAL})


@dataclass
class BrokerOptions:
    liveness: Liveness = field(default_factory=Liveness)
    max_queued_tokens: int = MAX_QUEUED_TOKENS
    batch_timeout_s: float = BATCH_TIMEOUT_S
    hang_s: float = HANG_S  # holding batches with no progress this long: buried as hung
    max_attempts: int = MAX_ATTEMPTS
    aging_s: float = AGING_S
    # While a model sees live traffic, each worker holds at most this many of its batch budgets
    # of batch-lane work (LIVE_BULK_BATCHES), live meaning a query waits or came within
    # live_window_s.
    live_bulk_batches: float = LIVE_BULK_BATCHES
    live_bulk_ms: float = LIVE_BULK_MS  # ... and at most this much of its measured compute
    # A CPU worker's bulk is capped at this much of its compute at all times, instead of
    # live_bulk_ms while live (0: as any other worker's): CPU_BULK_MS.
    cpu_bulk_ms: float = CPU_BULK_MS
    live_window_s: float = LIVE_WINDOW_S
    # Queued work of a model whose last worker left fails with UNAVAILABLE after this long.
    orphan_grace_s: float | None = None  # None: one liveness expiry
    # ... and the model itself is forgotten after this long (then MODEL_NOT_FOUND).
    forget_model_s: float = MODEL_FORGET_S

    def __post_init__(self) -> None:
        # Zero would stop bulk work for as long as queries keep coming: starvation, not a cap.
        if self.live_bulk_batches <= 0 or self.live_bulk_ms <= 0:
            raise ValueError("live_bulk_batches and live_bulk_ms must be positive")
        if self.cpu_bulk_ms < 0:
            raise ValueError("cpu_bulk_ms must not be negative (0 turns the bound off)")
        if self.hang_s <= 0 or self.live_window_s < 0 or self.forget_model_s <= 0:
            raise ValueError("hang_s and forget_model_s must be positive, live_window_s >= 0")


class Broker:
    def __init__(self, frontend: zmq.Socket, backend: zmq.Socket, options: BrokerOptions) -> None:
        self.front = frontend
        self.back = backend
        self.opts = options
        self.queue = Queue(options.max_queued_tokens, options.aging_s, options.live_window_s)
        self.inflight = InFlight(options.max_attempts)
        self.registry = Registry()
        self.dropped = 0
        self.refused_workers = 0  # READYs refused: a card conflicting with the one served
        self.handler_errors = 0  # messages whose handler raised (each also counts as dropped)
        self.warned = PeerWarnings()
        self._orphaned_since: dict[str, float] = {}
        self._stop = False
        self._arrived = 0.0  # perf_counter when the message being handled was received
        self._frame: Any = None  # the first frame of that message (its connection: LinkWatch)
        self.links = LinkWatch()
        self.book = StatsBook()  # counters and gone workers, for the Pong's stats
        self.instance = secrets.randbits(63)

    def stop(self) -> None:
        self._stop = True

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        poller.register(self.links.open(self.back), zmq.POLLIN)
        try:
            self._loop(poller)
        finally:
            self.links.close()

    def _loop(self, poller: zmq.Poller) -> None:
        interval = self.opts.liveness.interval_s
        next_beat = time.monotonic()
        while not self._stop:
            events = dict(poller.poll(timeout=min(50, interval * 1000)))
            now = time.monotonic()
            # Disconnects before messages: a descriptor closed, then reused by a new worker's
            # connection, is read as the old worker's end before the new one's READY.
            if self.links.monitor in events:
                for identity in self.links.closed():
                    self._bury(identity, "its connection closed", now, tell=False)
            if self.back in events:
                self._drain(self.back, self._on_backend, now)
            if self.front in events:
                self._drain(self.front, self._on_frontend, now)
            if now >= next_beat:
                self._tick(now)
                next_beat = now + interval
            else:
                self._expire(now)

    def _drain(self, sock: zmq.Socket, handler: Any, now: float) -> None:
        # Bounded so one busy side cannot starve the other or the timers.
        for frames in waiting(sock, limit=1000):
            # Per message, not the per-poll ``now``: the per-hop timings are sub-millisecond.
            self._arrived = time.perf_counter()
            self._frame = frames[0]
            identity = frames[0].bytes
            try:
                msg = decode(frames[1:])
            except ProtocolError as exc:
                self._malformed(sock, identity, exc)
                continue
            try:
                handler(identity, msg, now)
            except Exception:
                # Last line of defence: a message that trips a bug costs that message, not the
                # broker and every request it holds. Validation should have caught it first.
                self.dropped += 1
                self.handler_errors += 1
                if self.warned.first(identity):
                    log.exception(
                        "dropped %s from %r after it failed", type(msg).__name__, identity
                    )

    def _malformed(self, sock: zmq.Socket, identity: bytes, exc: ProtocolError) -> None:
        self.dropped += 1
        if self.warned.first(identity):
            log.warning("dropping malformed message from %r: %s", identity, exc.reason)
        if sock is self.front and exc.cid is not None:
            self._send_front(identity, RequestError(exc.cid, ErrorCode.PROTOCOL, exc.reason))

    def _send_front(self, identity: bytes, msg: Message) -> None:
        send_frames(self.front, [identity, *encode(msg)])

    def _send_back(self, identity: bytes, msg: Message) -> None:
        send_frames(self.back, [identity, *encode(msg)])

    def _tick(self, now: float) -> None:
        """Once per heartbeat interval: beat to workers, bury the silent and the hung."""
        beat = encode(Heartbeat(progress=0, busy=False))
        for identity in self.registry.workers:
            send_frames(self.back, [identity, *beat])
        for worker in self.registry.silent(now):
            self._bury(worker.identity, f"silent for {now - worker.last_heard:.1f}s", now)
        for batch in self.inflight.overdue(now):
            if batch.worker in self.registry.workers:
                self._bury(batch.worker, f"batch {batch.batch_id} overdue (hung?)", now)
        self._bury_stalled(now)
        self._fail_orphans(now)
        self._expire(now)

    def _bury_stalled(self, now: float) -> None:
        """Bury workers that hold batches while their progress counter stands still."""
        for worker in list(self.registry.workers.values()):
            held = self.inflight.for_worker(worker.identity)
            if not held:
                continue  # an idle worker makes no progress and is not hung
            # A batch dispatched after the last progress may fairly take hang_s on its own.
            since = max(worker.progress_at, held[0].dispatched_at)
            if now - since > self.opts.hang_s:
                why = f"no progress for {now - since:.1f}s holding {len(held)} batches (hung?)"
                self._bury(worker.identity, why, now)

    def _expire(self, now: float) -> None:
        for request in self.queue.expire(now):
            self._answer_error(request, ErrorCode.DEADLINE_EXCEEDED, "deadline passed")

    # ---- frontend -----------------------------------------------------------------------------

    def _on_frontend(self, identity: bytes, msg: Message, now: float) -> None:
        if isinstance(msg, SubmitRequest):
            self._submit(identity, msg, now)
        elif isinstance(msg, CancelRequest):
            self.queue.cancel((identity, msg.cid))
        elif isinstance(msg, Ping):
            self._send_front(
                identity, Pong(cid=msg.cid, instance=self.instance, stats=self.stats(now))
            )
        elif isinstance(msg, CatalogRequest):
            self._send_front(identity, CatalogReply(cid=msg.cid, models=self.registry.catalog()))
        elif isinstance(msg, TokenizerRequest):
            blob = self.registry.tokenizers.get(msg.digest)
            reply = TokenizerReply(msg.cid, msg.digest, blob is not None, blob or b"")
            self._send_front(identity, reply)
        else:
            self._malformed(self.front, identity, ProtocolError(f"{type(msg).__name__} on front"))

    def _submit(self, identity: bytes, msg: SubmitRequest, now: float) -> None:
        error = self._admit(identity, msg, now)
        if error is not None:
            code, text, retry_ms = error
            self._send_front(identity, RequestError(msg.cid, code, text, retry_ms))

    def _admit(
        self, identity: bytes, msg: SubmitRequest, now: float
    ) -> tuple[ErrorCode, str, int | None] | None:
        """Queue ``msg`` and dispatch, or say why it is refused (it then never enters a batch)."""
        model = self.registry.resolve(msg.model)
        if model is None:
            return ErrorCode.MODEL_NOT_FOUND, f"model {msg.model!r} is not served", None
        if self.registry.count(model) == 0:
            return ErrorCode.UNAVAILABLE, f"no worker serves {model!r} now", None
        # Once: the check and the queue's prefix sums share it. np.diff's own overhead was 3x
        # this subtraction's on a one-text query.
        lengths = msg.offsets[1:] - msg.offsets[:-1]
        # The client's own check (proto_msgs.checks), again: any peer may send a submit.
        problem = submit_problem(self.registry.known_models[model], msg, lengths)
        if problem is not None:
            return problem.code, problem.message, None
        deadline = now + msg.timeout_ms / 1000 if msg.timeout_ms is not None else None
        request = Request(
            key=(identity, msg.cid),
            model=model,
            lane=msg.lane,  # type: ignore[arg-type]
            lengths=lengths,
            deadline=deadline,
            submitted_at=now,
            payload=msg,
            received_at=self._arrived,
        )
        try:
            self.queue.submit(request, now, self.registry.drain_rate(model))
        except Overloaded as exc:
            retry_ms = int((exc.retry_after_s or 1.0) * 1000)
            return ErrorCode.OVERLOADED, exc.message, retry_ms
        except RequestTooLarge as exc:
            return ErrorCode.TOO_LARGE, exc.message, None
        except ValueError as exc:  # duplicate cid from this peer
            return ErrorCode.PROTOCOL, str(exc), None
        self._dispatch(model, now)
        return None

    def _answer_error(self, request: Request, code: ErrorCode, text: str) -> None:
        identity, cid = request.key
        self._send_front(identity, RequestError(cid, code, text))

    # ---- dispatch -----------------------------------------------------------------------------

    def _dispatch(self, model: str, now: float) -> None:
        """Give each worker of ``model`` with a free credit a batch, while work remains."""
        while self.queue.queued_sequences(model):
            for worker in self.registry.with_credit(model):
                formed = self._form(model, worker, now)
                if formed is None:
                    continue  # nothing this worker may take now; another may hold less bulk
                for request in formed.expired:
                    self._answer_error(request, ErrorCode.DEADLINE_EXCEEDED, "deadline passed")
                for request in formed.refused:
                    self._answer_error(
                        request,
                        ErrorCode.TOO_LARGE,
                        f"a sequence is over the batch budget {worker.max_batch_tokens}",
                    )
                if formed.slices:
                    self._send_batch(worker, formed, now)
                    break
            else:
                return

    def _form(self, model: str, worker: WorkerState, now: float) -> FormedBatch | None:
        """The next batch for ``worker``: lanes apart for one with a live lane (its queries
        run beside its bulk), else the shared batch under the live-first bulk cap."""
        if worker.live_credits:
            return self.queue.form_lane_batch(
                model,
                worker.max_batch_tokens,
                worker.max_batch_requests,
                now,
                live_tokens=worker.live_tokens,
                bulk_allowed=worker.free > worker.live_credits,
            )
        # A CPU worker's bulk is bounded in time whether or not queries came lately, by its
        # own knob in place of live_bulk_ms: a lone query must not find a batch of seconds
        # running (docs/tuning.md).
        bounded = self.opts.cpu_bulk_ms > 0 and worker.on_cpu
        live_ms = self.opts.cpu_bulk_ms if bounded else self.opts.live_bulk_ms
        return self.queue.form_batch(
            model,
            worker.max_batch_tokens,
            worker.max_batch_requests,
            now,
            bulk_cap=worker.bulk_cap(self.opts.live_bulk_batches, live_ms),
            capped=bounded,
            bulk_held=self.inflight.bulk_tokens(worker.identity),
            # One credit stays free for live work; bulk shares the others.
            bulk_split=max(1, worker.credits - 1),
            last_credit=worker.credits > 1 and worker.free == 1,
        )

    def _send_batch(self, worker: WorkerState, formed: FormedBatch, now: float) -> None:
        deadline = now + self.opts.batch_timeout_s
        batch = self.inflight.add(worker.identity, formed.slices, now, deadline, formed.bulk_tokens)
        batch.plan = plan_batch(
            batch.batch_id, worker.model.name, formed.slices, self.opts.batch_timeout_s
        )
        worker.free -= 1
        send_frames(self.back, [worker.identity, *encode(batch.plan.message)])
        batch.sent_at = time.perf_counter()
        self.book.dispatched(
            worker.model.name, formed.slices, formed.tokens, worker.max_batch_tokens, now
        )

    # ---- backend ------------------------------------------------------------------------------

    def _on_backend(self, identity: bytes, msg: Message, now: float) -> None:
        if isinstance(msg, WorkerReady):
            self._on_ready(identity, msg, now)
            return
        worker = self.registry.heard(identity, now)
        if worker is None:
            # A worker from before a broker restart: tell it to READY again.
            if not isinstance(msg, Disconnect):
                self._send_back(identity, Disconnect(reason="unknown worker; send READY"))
            return
        if isinstance(msg, Heartbeat):
            if msg.progress != worker.progress:
                worker.progress, worker.progress_at = msg.progress, now
        elif isinstance(msg, BatchResult):
            self._on_result(worker, msg, now)
        elif isinstance(msg, BatchError):
            self._on_batch_error(worker, msg, now)
        elif isinstance(msg, Disconnect):
            # Leaving is normal (a stop, a rolling restart): not worth a warning.
            self._bury(
                identity, f"left: {msg.reason}", now, tell=False, level=logging.INFO, left=True
            )
        else:
            self._malformed(self.back, identity, ProtocolError(f"{type(msg).__name__} on back"))

    def _level(self, identity: bytes) -> int:
        """WARNING the first time a peer misbehaves, DEBUG after: a peer repeating READY (a
        crash-looping or hostile worker) wrote 11,220 warnings in the fuzz run's 1 M frames."""
        return logging.WARNING if self.warned.first(identity) else logging.DEBUG

    def _on_ready(self, identity: bytes, msg: WorkerReady, now: float) -> None:
        if identity in self.registry.workers:
            self._bury(identity, "re-registered", now, tell=False, level=self._level(identity))
        refusal = self._refuse_card(msg)
        if refusal is not None:
            self.refused_workers += 1
            log.log(self._level(identity), "refusing worker %s: %s", msg.name, refusal)
            self._send_back(identity, Disconnect(reason=refusal))
            return
        worker = self.registry.add(identity, msg, now, self.opts.liveness.liveness)
        former = self.links.note(identity, self._frame)
        if former is not None:
            self._bury(former, "its connection closed", now, tell=False)
        self._orphaned_since.pop(worker.model.name, None)
        self.book.came_up(worker)
        log.info(
            "worker %s ready: %s on %s, %d credits, %d tokens/batch",
            worker.name,
            worker.model.name,
            worker.device,
            worker.credits,
            worker.max_batch_tokens,
        )
        self._dispatch(worker.model.name, now)

    def _refuse_card(self, msg: WorkerReady) -> str | None:
        """Why a READY's card cannot join the catalog; None when it can.

        The first card of a served model stays: clients validated and tokenized against it, so
        a different one under the same name is refused, never merged. A model whose workers all
        left may change its card; its queued work, checked against the old one, is failed.
        """
        card = msg.model
        # A known digest compares bytes (memcmp); only a new one is hashed.
        blob = self.registry.tokenizers.get(card.tokenizer_digest)
        if blob is None:
            genuine = hashlib.sha256(msg.tokenizer_json).hexdigest() == card.tokenizer_digest
        else:
            genuine = blob == msg.tokenizer_json
        if not genuine:
            return "tokenizer_digest is not the sha256 of the tokenizer sent"
        known = self.registry.known_models.get(card.name)
        differ = [] if known is None else card_differences(known, card)
        if not differ:
            return None
        if self.registry.count(card.name):
            return f"model {card.name!r} is served with a different {', '.join(differ)}"
        self._forget_model(card.name, f"model {card.name!r} changed its {', '.join(differ)}")
        return None

    def _on_result(self, worker: WorkerState, msg: BatchResult, now: float) -> None:
        batch = self.inflight.pop(msg.batch_id, worker.identity)
        if batch is None or batch.plan is None:
            return  # a duplicate, or a batch already taken back: harmless
        worker.free += 1
        worker.progress_at = now  # a result is progress, before the next heartbeat says so
        if not 0.0 <= msg.compute_ms < math.inf:  # NaN too: peer input, sent on to clients
            msg.compute_ms = 0.0  # unknown; a NaN would 500 the ingress's timing headers
        worker.note_compute(batch.tokens, msg.compute_ms, batch.bulk_tokens)
        try:
            chunks = result_chunks(
                batch.plan, msg, batch.dispatched_at, batch.sent_at, self._arrived
            )
        except ValueError as exc:
            self.dropped += 1
            if self.warned.first(worker.identity):
                log.error("worker %s sent a malformed result: %s", worker.name, exc)
            self._requeue([batch])
        else:
            for piece, chunk in chunks:
                self._send_front(piece.request.key[0], chunk)
                self.queue.complete(piece.request, piece.end - piece.start)
            self.book.completed(worker, batch.slices, batch.tokens)
        self._dispatch(worker.model.name, now)

    def _on_batch_error(self, worker: WorkerState, msg: BatchError, now: float) -> None:
        batch = self.inflight.pop(msg.batch_id, worker.identity)
        if batch is None:
            return
        worker.free += 1
        worker.progress_at = now
        if msg.retryable:
            self._requeue([batch])
        elif (
            msg.code in ISOLATED_CODES
            and len({piece.request for piece in batch.slices if piece.request.live}) > 1
        ):
            # Which request is at fault is unknown: each is retried alone, and only the one
            # that fails alone gets the error (the attempt cap still bounds the retries).
            self._requeue([batch], isolate=True)
        else:
            for piece in batch.slices:
                if self.queue.fail_request(piece.request):
                    self._answer_error(piece.request, ErrorCode(msg.code), msg.message)
        self._dispatch(worker.model.name, now)

    def _requeue(
        self, batches: list[InFlightBatch], isolate: bool = False, refund: bool = False
    ) -> None:
        slices = [piece for batch in batches for piece in batch.slices]
        if refund:
            # A worker that left on purpose (a stop, a rolling restart) did not fail these: its
            # dispatch is not an attempt, or a request would fail after max_attempts restarts.
            slices = [piece._replace(attempt=max(0, piece.attempt - 1)) for piece in slices]
        requeue, give_up = self.inflight.split_retry(slices)
        for piece in give_up:
            if self.queue.fail_request(piece.request):
                self._answer_error(
                    piece.request,
                    ErrorCode.WORKER_FAILED,
                    f"workers failed on this input {piece.attempt} times",
                )
        if isolate:
            self.queue.isolate(requeue)
        else:
            self.queue.requeue_front(requeue)

    def _bury(
        self,
        identity: bytes,
        why: str,
        now: float,
        tell: bool = True,
        level: int = logging.WARNING,
        left: bool = False,
    ) -> None:
        """Remove a dead, hung or leaving (``left``: it said Disconnect) worker and put its
        batches back at the head of the queue."""
        worker = self.registry.remove(identity)
        self.links.forget(identity)
        if worker is None:
            return
        batches = self.inflight.remove_worker(identity)
        self.book.went_down(worker, why, now)
        log.log(
            level, "worker %s removed (%s); requeueing %d batches", worker.name, why, len(batches)
        )
        if tell:
            self._send_back(identity, Disconnect(reason=why))
        self._requeue(batches, refund=left)
        model = worker.model.name
        if self.registry.count(model) == 0:
            self._orphaned_since.setdefault(model, now)
        self._dispatch(model, now)

    def _fail_orphans(self, now: float) -> None:
        grace = self.opts.orphan_grace_s
        grace = self.opts.liveness.expiry_s if grace is None else grace
        for model, since in list(self._orphaned_since.items()):
            if self.registry.count(model):
                del self._orphaned_since[model]
            elif now - since >= self.opts.forget_model_s:
                self._forget_model(model, f"no worker serves {model!r} any more")
                log.info("model %s forgotten: no worker for %.0fs", model, now - since)
            elif now - since >= grace:
                # Its in-flight work was requeued when the worker was buried, so this ends
                # every request of the model (and what arrived since: none is admitted).
                self._fail_queued(model, f"no worker serves {model!r} any more")

    def _fail_queued(self, model: str, why: str) -> None:
        for request in self.queue.drain_model(model):
            self._answer_error(request, ErrorCode.UNAVAILABLE, why)

    def _forget_model(self, model: str, why: str) -> None:
        """Fail what is queued for ``model`` and drop its card: it is unknown from now on."""
        self._fail_queued(model, why)
        self.queue.forget_model(model)
        self.registry.forget(model)
        self._orphaned_since.pop(model, None)

    # ---- stats --------------------------------------------------------------------------------

    def stats(self, now: float | None = None) -> BrokerStats:
        now = time.monotonic() if now is None else now
        return self.book.snapshot(self.queue, self.registry, self.inflight, self.dropped, now)

"""A worker process: the compute loop on the main thread, the broker link on its own thread,
a finisher thread between them.

The link decodes batches into a queue; the compute loop launches each on the engine with its
output groups' post-processing (Matryoshka prefix, normalization, quantization; see
:mod:`mesh.worker.pipeline`); the finisher waits for each batch's results in order, encodes
them and hands them back to the link over inproc. So (de)serialization and the next batch's
preparation overlap the device's work. An idle CUDA worker runs a small, quick batch (a live
query) on the link thread from end to end instead, sparing it three thread hand-offs
(:meth:`WorkerServer._accept`; a CPU worker runs every forward on the compute thread, see
:func:`inline_max_ms_for`). With a live lane (:mod:`mesh.worker.live_lane`), every
batch of the lane's size runs on the lane, busy or idle: on the link thread when quick and
the lane is free, else on the lane's own thread.
"""

from __future__ import annotations

import contextlib
import cProfile
import faulthandler
import logging
import os
import queue
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from mesh.config import WORKER_WATCHDOG_S, Liveness
from mesh.env_knobs import float_from_env
from mesh.transport import send_frames
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.runner import EngineEntry
from mesh.worker.link import BrokerLink, Incoming, Reply
from mesh.worker.live_gate import LiveGate, live_gate_ms_from_env
from mesh.worker.live_lane import LiveLane
from mesh.worker.pipeline import Launched, ResultPipeline
from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    ErrorCode,
    ModelInfo,
    WorkerReady,
    encode,
)

log = logging.getLogger("embedmesh.worker")

SWITCH_INTERVAL_S = 0.0005  # GIL handoff bound while serving; see WorkerServer.run
# An idle (CUDA) worker runs a batch on the link thread itself when it is a live query's size (the
# ingress sends more than this many tokens on the batch lane) and batches of that size took
# at most this long lately (scaled by tokens). Bounds how long the link stops reading (and
# heartbeating) and how long a batch arriving meanwhile waits. See WorkerServer._accept.
INLINE_MAX_TOKENS = 1024
INLINE_MAX_MS = 10.0  # 0 turns the inline path off; 1..50 is reasonable
# The inline path polls its batch's CUDA event this long before sleeping on it: an idle
# query's device time (0.3-1.5 ms on an H200) ends without the driver's wake-up after it.
# Nothing else waits for the GIL then (the worker is idle). 0..0.005 is reasonable.
INLINE_SPIN_S = 0.002
# The exit code of a worker its watchdog found hung (EX_SOFTWARE): a supervisor restarts it.
EXIT_HUNG = 70


def switch_interval_s() -> float:
    """The GIL switch interval while serving: ``EMBEDMESH_WORKER_SWITCH_US`` (microseconds,
    50..5000, for measuring what a live query's hops on the link and lane threads lose to the
    compute thread's share of the GIL), else SWITCH_INTERVAL_S. A bad value keeps the default."""
    default_us = SWITCH_INTERVAL_S * 1e6
    us = float_from_env("EMBEDMESH_WORKER_SWITCH_US", default_us, 50, 5000, "us", log)
    return SWITCH_INTERVAL_S if us == default_us else us / 1e6


def inline_max_ms_for(device_type: str, live_lane: bool = False) -> float:
    """The inline bound for a worker on ``device_type``: none on CPU without a live lane, so
    that every forward runs on the compute thread. torch's CPU kernels run on OpenMP
    (libgomp), which keeps a thread team per thread that calls into it; once two threads have
    run forwards (the compute thread's bulk, the link thread's inline queries), both run
    their parallel regions about 1.5-2x slower for the rest of the process (a 15-token
    MiniLM forward: 8 -> 13 ms on the 2-core VM; docs/tuning.md, "Threads and workers on a
    CPU"), while the hand-offs the inline path saves cost a fraction of a millisecond.
    An explicit live lane on CPU keeps the bound: it asked for forwards on other threads.
    On CUDA a forward's CPU side is kernel launches, not OpenMP work."""
    return 0.0 if device_type == "cpu" and not live_lane else INLINE_MAX_MS


@dataclass
class WorkerOptions:
    name: str
    credits: int
    max_batch_tokens: int
    max_batch_requests: int
    device: str
    test_hang_after: int | None = None  # test hook: the compute loop hangs after N batches
    # 0: every batch goes through the compute thread; None: inline_max_ms_for the engine's
    # device (none on CPU without a live lane).
    inline_max_ms: float | None = None
    # Run small batches beside bulk on a lane of their own (mesh.worker.live_lane), keeping
    # one of ``credits`` for it; needs an Engine (its live_lane sibling) and two credits.
    live_lane: bool = False
    profile_out: str | None = None  # diagnostics: cProfile the compute loop, stats here
    # Exit (EXIT_HUNG) after holding batches this long with none answered; 0 = never.
    watchdog_s: float = WORKER_WATCHDOG_S
    # The rate it measured at start (WorkerReady.tokens_per_s): the auto sweep's, or a probe's.
    tokens_per_s: float = 0.0


@dataclass
class LoopStats:
    """Where the worker loop's time goes (summed; logged when the loop stops), to tell a
    host-bound worker from a device-bound one."""

    batches: int = 0
    waited_s: float = 0.0  # from arrival at the link to the start of its launch
    launch_s: float = 0.0  # compute thread: checks, forward launch, result copies queued
    collect_s: float = 0.0  # finisher: waiting for the device, copying results out, encoding
    send_s: float = 0.0  # finisher: handing the frames to the link
    inline: int = 0  # of the batches, those run on the link thread (idle inline or live lane)
    live: int = 0  # of those, the ones on the live lane

    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per thread

    def summary(self) -> str:
        n = max(1, self.batches)
        parts = ("waited", "launch", "collect", "send")
        means = ", ".join(f"{p} {1000 * getattr(self, p + '_s') / n:.2f}" for p in parts)
        means += f"; on the link thread {self.inline} ({self.live} on the live lane)"
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = {**self.cpu_s, "process": usage.ru_utime + usage.ru_stime}
        cpus = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
        return f"{self.batches} batches; mean ms: {means}; CPU s: {cpus}"


def reply_timings(received_at: float, launched: Launched) -> dict[str, float]:
    """BatchResult.timings of one batch, in ms, from perf_counter stamps (no device syncs).

    "worker_reply" ends when the reply starts being encoded, the last moment a message can
    carry: the encoding itself (tens of µs for a query) and the hand-off to the link's socket
    come after it and are not counted.
    """
    return {
        "worker_wait": (launched.started - received_at) * 1000,
        "worker_compute": (launched.ready_at - launched.started) * 1000,
        "worker_reply": (time.perf_counter() - launched.ready_at) * 1000,
    }


class WorkerServer:
    def __init__(
        self,
        ctx: zmq.Context,
        engine: EngineEntry,
        model: ModelInfo,
        tokenizer_json: bytes,
        broker_endpoint: str,
        options: WorkerOptions,
        liveness: Liveness,
        connect: Any = None,
    ) -> None:
        self.engine = engine
        self.model = model
        self.options = options
        if options.live_lane and options.credits < 2:
            raise ValueError("a live lane needs two credits at least: one for it, one for bulk")
        live_tokens = min(INLINE_MAX_TOKENS, options.max_batch_tokens)
        self.live = LiveLane(engine, live_tokens) if options.live_lane else None
        self._lane_lock = threading.Lock()  # the lane's engine: one batch at a time
        # While a lane batch runs, the bulk threads leave it the GIL (mesh.worker.live_gate).
        self.gate = LiveGate(live_gate_ms_from_env() if self.live is not None else 0.0)
        self._lane_queue: queue.Queue[Incoming | None] | None = (
            queue.Queue() if self.live is not None else None
        )
        ready = WorkerReady(
            name=options.name,
            model=model,
            tokenizer_json=tokenizer_json,
            max_batch_tokens=options.max_batch_tokens,
            max_batch_requests=options.max_batch_requests,
            credits=options.credits,
            heartbeat_ms=max(1, int(liveness.interval_s * 1000)),
            device=options.device,
            live_credits=1 if self.live is not None else 0,
            live_tokens=live_tokens if self.live is not None else 0,
            tokens_per_s=options.tokens_per_s,
        )
        self.link = BrokerLink(
            ctx, broker_endpoint, ready, liveness, connect=connect, accept=self._accept
        )
        self.device = torch.device(engine.device)
        self.pipeline = ResultPipeline(engine, self.device, depth=max(1, options.credits))
        self._done: queue.Queue[tuple[Incoming, Launched | list[Any]] | None] = queue.Queue()
        self._outstanding = 0  # batches accepted from the link and not yet answered
        self._busy_lock = threading.Lock()
        # The last small batch (<= INLINE_MAX_TOKENS): (tokens, compute ms); unknown at first,
        # so the first one (a cold start, maybe a graph capture) takes the threaded path.
        # With a live lane, every lane batch times it (on the link thread or the lane's), so a
        # lane found slow once (a GC pause) takes the link thread again once it is quick.
        self._small: tuple[int, float] | None = None
        # The test hook hangs the compute loop, which the inline path would step around.
        bound = options.inline_max_ms
        if bound is None:
            bound = inline_max_ms_for(self.device.type, options.live_lane)
        self._inline_max_ms = 0.0 if options.test_hang_after is not None else bound
        if self.live is not None:  # warmed up (its graphs captured): no cold start to fear
            self._small = (16, self.live.warmup())
            log.info("live lane up: batches of at most %d tokens; 16 tokens in %.2f ms "
                     "(on the link thread while that scales within %.0f ms, else its own)",
                     live_tokens, self._small[1], self._inline_max_ms)  # fmt: skip
        self.stats = LoopStats()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        self.pipeline.stopping.set()
        if self.live is not None:
            self.live.pipeline.stopping.set()

    def run(self) -> None:
        """Serve until stop() (or a signal handler calling it).

        This (main) thread takes batches from the link and launches them; a finisher thread
        waits for each launched batch's results in order and sends the reply. So the device
        starts batch i + 1 while batch i's results are still on their way back, and batch
        i's reply (its credit) leaves the moment its results exist.
        """
        # Three threads share the GIL here, and the compute thread runs Python (and torch
        # dispatch) for ~1 ms a batch: with the default 5 ms switch interval, a reply or an
        # incoming batch could wait that long for it, which starves a fast GPU of credits.
        # Much shorter costs the compute thread in forced handoffs.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(switch_interval_s())
        if sys.getswitchinterval() != SWITCH_INTERVAL_S:
            log.info("GIL switch interval %.0f us", sys.getswitchinterval() * 1e6)
        self.link.start()
        finisher = threading.Thread(target=self._finish_loop, name="finisher", daemon=True)
        finisher.start()
        lane = None
        if self._lane_queue is not None:
            lane = threading.Thread(target=self._lane_loop, name="live-lane", daemon=True)
            lane.start()
        if self.options.watchdog_s > 0:
            threading.Thread(target=self._watchdog, name="watchdog", daemon=True).start()
        launched = 0
        cpu_at_start = time.thread_time()
        profile = cProfile.Profile() if self.options.profile_out else None
        if profile is not None:
            profile.enable()
        try:
            while not self._stop.is_set():
                try:
                    item = self.link.batches.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item.epoch != self.link.epoch:  # the broker took it back when we reconnected
                    self._track(-1)
                    continue
                if (
                    self.options.test_hang_after is not None
                    and launched >= self.options.test_hang_after
                ):
                    log.error("test hook: compute loop hangs now (after %d batches)", launched)
                    self._stop.wait()
                    break
                self.gate.yield_to_live()  # a live batch running: its GIL first
                started = time.perf_counter()
                self.stats.waited_s += started - item.received_at
                self._done.put((item, self._launch(item, self.pipeline)))
                self.stats.launch_s += time.perf_counter() - started
                launched += 1
        finally:
            # Also when the loop ended by an exception: the link then queues nothing more for
            # the lane thread, which is told to stop below.
            self._stop.set()
            self.stats.cpu_s["compute"] = time.thread_time() - cpu_at_start
            if profile is not None:
                profile.disable()
            self._done.put(None)
            finisher.join(timeout=10)
            if lane is not None:
                assert self._lane_queue is not None
                self._lane_queue.put(None)
                lane.join(timeout=10)
            self.link.stop()
            self.stats.cpu_s["link"] = self.link.cpu_s
            sys.setswitchinterval(switch)
            if profile is not None:
                try:
                    profile.dump_stats(self.options.profile_out)
                except OSError as exc:  # diagnostics must not break shutdown
                    log.error("could not write the profile: %s", exc)
            log.info("worker loop: %s; %s", self.stats.summary(), self.gate.summary())
            graphs = self.engine.graph_summary() if isinstance(self.engine, Engine) else None
            if graphs is not None:
                log.info("worker graphs: %s", graphs)

    def _accept(self, item: Incoming, reply: Reply) -> None:
        """Link thread, each batch: queue it for the compute loop, or run it here and send
        its reply with ``reply`` (on the link's socket). With a live lane (:mod:`mesh.worker.live_lane`)
        every batch of its size runs there, busy or not: here when quick and the lane free,
        else on the lane's own thread (``_lane_loop``), never behind bulk. Without one, a
        small, quick batch that finds the worker idle runs here.

        An idle query then wakes one thread instead of four (link → compute → finisher →
        link): each hand-off woke a sleeping thread, whose first microseconds run several
        times slower than warm code (docs/performance.md). The cost is
        that a batch arriving meanwhile waits for it; INLINE_MAX_MS bounds that, and how long
        the link does not read or heartbeat.
        """
        with self._busy_lock:
            lane = self._lane_takes(item.batch)
            live = lane and self._quick(item.batch, self.live.max_tokens)
            idle = self._outstanding == 0
            quick = idle and self._quick(item.batch, INLINE_MAX_TOKENS)
            self._outstanding += 1
            self.link.busy = True
        # The lane's engine runs one batch at a time: the link thread takes it only when the
        # lane thread is not inside one.
        if live and self._lane_lock.acquire(blocking=False):
            try:
                # The reply leaves inside the gate: its send wants the GIL too.
                with self.gate.live():
                    reply(self._run_here(item, live=True, spin=idle))
            finally:
                self._lane_lock.release()
            return
        if lane:  # too slow for the link thread, or the lane busy: its own thread, not bulk's
            assert self._lane_queue is not None
            self._lane_queue.put(item)
            return
        if quick:
            reply(self._run_here(item, live=False, spin=True))
            return
        self.link.batches.put(item)

    def _lane_takes(self, batch: BatchAssign) -> bool:
        """Whether ``batch`` runs on the live lane (on this thread or the lane's): small
        enough, and the link thread allowed to run batches at all (inline bound > 0)."""
        return (
            self.live is not None
            and len(batch.token_ids) <= self.live.max_tokens
            and self._inline_max_ms > 0
            and not self._stop.is_set()
        )

    def _run_here(self, item: Incoming, live: bool, spin: bool) -> list[Any]:
        """Run ``item`` to its reply frames on the calling thread (the link's or the lane's),
        on the lane (``live``) or the main engine; ``spin``: poll its result (only when
        nothing else runs: spinning holds the GIL, which the compute thread needs while bulk
        is in flight)."""
        started = time.perf_counter()
        self.stats.waited_s += started - item.received_at
        pipeline = self.pipeline
        if live:
            assert self.live is not None
            place = self.live.running()
            pipeline = self.live.pipeline
        elif self.device.type == "cuda":  # CUDA's current device is per thread
            place = torch.cuda.device(self.device)
        else:
            place = contextlib.nullcontext()
        launch_end = started
        try:
            with place:
                launched = self._launch(item, pipeline)
                launch_end = time.perf_counter()
                self.stats.launch_s += launch_end - started
                frames = (
                    launched
                    if isinstance(launched, list)
                    else self._collect(
                        item, launched, INLINE_SPIN_S if spin else 0.0, pipeline, learn=True
                    )
                )
        except Exception as exc:  # entering the stream or device (launch and collect catch theirs)
            log.exception("batch %d failed off the compute thread", item.batch.batch_id)
            frames = encode(BatchError(item.batch.batch_id, ErrorCode.INTERNAL, repr(exc), True))
        self.stats.collect_s += time.perf_counter() - launch_end
        self.stats.inline += 1
        self.stats.live += live
        self._answered()
        return frames

    def _lane_loop(self) -> None:
        """The lane's own thread: its batches the link thread did not run (slower than the
        inline bound, or arriving while the lane was busy), so that they never wait behind
        the bulk the compute thread holds. Replies go to the link as the finisher's do."""
        assert self._lane_queue is not None
        sender = self.link.result_sender()
        try:
            while True:
                item = self._lane_queue.get()
                if item is None:
                    break
                # As the compute loop: a batch of a session the link left behind (the broker
                # took it back and may send it here again) is dropped, not computed for a
                # reply the link would drop, ahead of the new session's queries.
                if item.epoch != self.link.epoch:
                    self._track(-1)
                    continue
                # The hand-off to the link inside the gate too: bulk threads woken before it
                # could take the GIL from it (and their replies could pass it).
                with self.gate.live():
                    with self._lane_lock:
                        frames = self._run_here(item, live=True, spin=False)
                    self._hand_to_link(sender, item, frames)
        finally:
            sender.close(linger=0)

    def _quick(self, batch: BatchAssign, max_tokens: int) -> bool:
        """Small enough for the link thread: at most ``max_tokens``, and the last batch run
        there (or on the lane's thread), scaled up to this one's tokens, computed within the
        inline bound."""
        tokens = len(batch.token_ids)
        if tokens > max_tokens or self._small is None or self._stop.is_set():
            return False
        seen_tokens, seen_ms = self._small
        bound_ms = self._inline_max_ms  # 0: the link thread runs nothing
        return bound_ms > 0 and seen_ms * max(1.0, tokens / max(1, seen_tokens)) <= bound_ms

    @staticmethod
    def _hand_to_link(sender: zmq.Socket, item: Incoming, frames: list[Any]) -> None:
        """A reply from a thread other than the link's (finisher, lane) to the link's socket."""
        try:
            send_frames(sender, [str(item.epoch).encode(), *frames])
        except zmq.ZMQError:  # lost reply: the broker's batch deadline requeues it
            log.exception("could not hand batch %d's reply to the link", item.batch.batch_id)

    def _watchdog(self) -> None:
        """Exit the process when it has held batches for ``watchdog_s`` and answered none.
        Nothing else would: a deadlocked device leaves the threads waiting for good, the
        broker only buries the worker, and the process keeps the GPU. Exiting, with every
        thread's stack in the log, lets the supervisor start a fresh one."""
        limit = self.options.watchdog_s
        answered, since = -1, time.monotonic()
        while not self._stop.wait(min(1.0, limit / 4)):
            with self._busy_lock:
                now_answered, held = self.stats.batches, self._outstanding
            now = time.monotonic()
            if now_answered != answered or held == 0:
                answered, since = now_answered, now
                continue
            if now - since >= limit:
                try:
                    log.critical(
                        "hung: %d batches held and none answered for %.0f s; exiting (code %d) "
                        "for a fresh start. Every thread's stack:", held, now - since, EXIT_HUNG
                    )  # fmt: skip
                    # The stacks are for the log; the exit must not depend on them (a closed
                    # or missing stderr raises here, and the process would keep the GPU).
                    with contextlib.suppress(Exception):
                        faulthandler.dump_traceback(file=sys.__stderr__ or 2, all_threads=True)
                        (sys.__stderr__ or sys.stderr).flush()
                finally:
                    os._exit(EXIT_HUNG)

    def _answered(self) -> None:
        """A batch's reply is with the link: count progress, free the worker. Under the lock:
        with a live lane the link thread and the finisher answer at once, and a count both
        read before either wrote it lost a batch (in the progress the heartbeats carry)."""
        with self._busy_lock:
            self.stats.batches += 1
            self.link.progress = self.stats.batches
            self._outstanding -= 1
            self.link.busy = self._outstanding > 0

    def _launch(self, item: Incoming, pipeline: ResultPipeline) -> Launched | list[Any]:
        """Launch ``item`` on ``pipeline``'s engine, or the frames of its error reply."""
        batch = item.batch
        expired = time.perf_counter() - item.received_at > batch.timeout_ms / 1000
        if expired:
            return encode(
                BatchError(batch.batch_id, ErrorCode.DEADLINE_EXCEEDED, "batch expired", False)
            )
        # The model, ids, lengths and dims are not checked again here: the worker trusts its
        # broker, which dispatches a worker only its own model's batches, each request checked
        # against the card (proto_msgs.checks).
        try:
            return pipeline.launch(batch)
        except ValueError as exc:  # e.g. dims wider than the model: the input is at fault
            return encode(BatchError(batch.batch_id, ErrorCode.INVALID_INPUT, str(exc), False))
        except Exception as exc:  # engine failure: let another worker try (attempt-capped)
            log.exception("batch %d failed", batch.batch_id)
            return encode(BatchError(batch.batch_id, ErrorCode.INTERNAL, repr(exc), True))

    def _finish_loop(self) -> None:
        """Owner of the result socket: replies in launch order, counts progress."""
        sender = self.link.result_sender()
        try:
            while True:
                entry = self._done.get()
                if entry is None:
                    break
                item, launched = entry
                started = time.perf_counter()
                if not isinstance(launched, list):
                    # Asleep until the device is done, then, if a live batch is running, until
                    # it is not: the copy-out and the encoding below want the GIL.
                    self.pipeline.wait(launched)
                    self.gate.yield_to_live()
                frames = (
                    launched
                    if isinstance(launched, list)
                    # With a live lane, a small batch here waited behind bulk: not its speed.
                    else self._collect(item, launched, learn=self.live is None)
                )
                collected = time.perf_counter()
                # Counted before the hand-off, as the link thread's own answers are: the next
                # batch can arrive the moment this reply leaves, and must find the worker idle
                # (the inline path) if this was all it held.
                self._answered()
                self._hand_to_link(sender, item, frames)
                self.stats.collect_s += collected - started
                self.stats.send_s += time.perf_counter() - collected
        finally:
            self.stats.cpu_s["finisher"] = time.thread_time()
            sender.close(linger=0)

    def _collect(
        self,
        item: Incoming,
        launched: Launched,
        spin_s: float = 0.0,
        pipeline: ResultPipeline | None = None,
        learn: bool = True,
    ) -> list[Any]:
        """The reply frames of a launched batch; ``learn``: its compute time, if small, is
        what ``_quick`` judges the next small batch by."""
        # Everything that can fail here is caught: an exception escaping would end this
        # thread, and with it every later reply of the worker.
        try:
            groups, ms = (pipeline or self.pipeline).collect(launched, spin_s)
            timings = reply_timings(item.received_at, launched)
            if learn and len(item.batch.token_ids) <= INLINE_MAX_TOKENS:
                self._small = (len(item.batch.token_ids), timings["worker_compute"])
            result = BatchResult(launched.batch_id, ms, groups, timings)
            return encode(result)
        except Exception as exc:  # a device fault surfaces here, at the wait
            log.exception("batch %d failed", launched.batch_id)
            return encode(BatchError(launched.batch_id, ErrorCode.INTERNAL, repr(exc), True))

    def _track(self, delta: int) -> None:
        with self._busy_lock:
            self._outstanding += delta
            self.link.busy = self._outstanding > 0

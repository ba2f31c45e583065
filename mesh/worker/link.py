"""The worker's link to its broker: one I/O thread that owns the DEALER socket.

It sends READY on every fresh connection, heartbeats every interval (with the compute loop's
progress counter, so a broker can tell a live socket from a live GPU loop), decodes incoming
batches into a queue for the compute loop, and forwards encoded results from the compute loop
(over an inproc PULL socket that this thread also owns). When the broker has been silent for
``liveness`` intervals it drops the socket and reconnects on a fresh one with exponential
backoff (1 s → 32 s), Paranoid-Pirate style.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from mesh.config import RECONNECT_BACKOFF_MAX_S, RECONNECT_BACKOFF_MIN_S, Liveness
from mesh.transport import send_frames, waiting
from proto_msgs import (
    BatchAssign,
    Disconnect,
    Heartbeat,
    ProtocolError,
    WorkerReady,
    decode,
    encode,
)

log = logging.getLogger("embedmesh.worker")

# Sends a reply's frames on the broker socket, at once, from the link thread.
Reply = Callable[[list[Any]], None]


@dataclass
class Incoming:
    """A decoded batch, tagged with the connection epoch it arrived on."""

    epoch: int
    batch: BatchAssign
    received_at: float  # perf_counter when the link read it: the worker's hop timings start here


class BrokerLink:
    """Owner of the DEALER socket; everything else talks to it through queues."""

    RESULTS_ENDPOINT = "inproc://embedmesh-worker-results"

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        ready: WorkerReady,
        liveness: Liveness,
        connect: callable | None = None,  # type: ignore[valid-type]
        accept: Callable[[Incoming, Reply], None] | None = None,
        backoff_min_s: float = RECONNECT_BACKOFF_MIN_S,
        backoff_max_s: float = RECONNECT_BACKOFF_MAX_S,
    ) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.ready = ready
        self.liveness = liveness
        self._connect = connect  # hook for CURVE: connect(sock, endpoint)
        # Called on this thread for each batch, with a function that sends a reply's frames
        # on the broker socket at once: it queues the batch, or runs it and replies before
        # it returns (the reply function is this thread's, for that call only). Without it,
        # batches go to ``batches``.
        self._accept = accept or self._enqueue
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.batches: queue.Queue[Incoming] = queue.Queue()
        self.epoch = 0  # bumped on every reconnect; stale batches and results are dropped
        self.progress = 0  # batches finished by the compute loop (written there, read here)
        self.busy = False
        self.dropped_frames = 0
        self.cpu_s = 0.0  # this thread's CPU seconds, set when it ends
        self.connected = threading.Event()
        self._stop = threading.Event()
        # Bound here, before the thread starts, so the compute loop can connect at once.
        self._results = ctx.socket(zmq.PULL)
        self._results.bind(self.RESULTS_ENDPOINT)
        self._thread = threading.Thread(target=self._run, name="broker-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def result_sender(self) -> zmq.Socket:
        """A PUSH socket for the compute thread (it owns it) to hand results to this link."""
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.RESULTS_ENDPOINT)
        return sock

    def _new_socket(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self._connect is not None:
            self._connect(sock, self.endpoint)
        else:
            sock.connect(self.endpoint)
        send_frames(sock, encode(self.ready))
        return sock

    def _run(self) -> None:
        try:
            self._reconnect_loop()
        finally:
            self.cpu_s = time.thread_time()  # for the worker's loop stats

    def _reconnect_loop(self) -> None:
        backoff = self.backoff_min_s
        while not self._stop.is_set():
            sock = self._new_socket()
            heard = self._serve(sock)
            sock.close(linger=0)
            self.connected.clear()
            if self._stop.is_set():
                break
            # Batches still queued belong to the old session (the broker requeues them): the
            # compute loop drops them by their epoch.
            self.epoch += 1
            backoff = self.backoff_min_s if heard else min(backoff * 2, self.backoff_max_s)
            log.warning("broker %s silent; reconnecting in %.1fs", self.endpoint, backoff)
            self._stop.wait(backoff)

    def _serve(self, sock: zmq.Socket) -> bool:
        """Pump one connection until the broker is silent too long; True if it ever spoke."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._results, zmq.POLLIN)
        interval = self.liveness.interval_s
        heard_any = False
        last_heard = time.monotonic()
        next_beat = time.monotonic() + interval
        epoch = self.epoch
        while not self._stop.is_set():
            timeout_ms = max(0.0, next_beat - time.monotonic()) * 1000
            events = dict(poller.poll(min(timeout_ms, 100)))
            now = time.monotonic()
            if sock in events:
                for frames in waiting(sock):
                    last_heard = now
                    heard_any = True
                    self.connected.set()
                    if not self._on_message(sock, frames, epoch, time.perf_counter()):
                        return heard_any
            if self._results in events:
                self._forward_results(sock, epoch)
            if now >= next_beat:
                beat = Heartbeat(progress=self.progress, busy=self.busy)
                send_frames(sock, encode(beat))
                next_beat = now + interval
            if now - last_heard > self.liveness.expiry_s:
                return heard_any
        with contextlib.suppress(zmq.ZMQError):
            # Replies the compute side finished while we were stopping go out first: the
            # broker would otherwise requeue that work and another worker redo it.
            self._forward_results(sock, epoch)
            send_frames(sock, encode(Disconnect(reason="worker shutting down")))
        return heard_any

    def _forward_results(self, sock: zmq.Socket, epoch: int) -> None:
        for tagged in waiting(self._results):
            # First frame is the epoch the batch came in on: results of an old session go
            # nowhere (the broker already gave that work to someone else).
            if int(tagged[0].bytes) == epoch:
                send_frames(sock, tagged[1:])

    def _enqueue(self, item: Incoming, _reply: Reply) -> None:
        self.batches.put(item)

    def _on_message(
        self, sock: zmq.Socket, frames: list[zmq.Frame], epoch: int, received_at: float
    ) -> bool:
        """Handle one broker message; False means 'reconnect now'."""
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            self.dropped_frames += 1
            if self.dropped_frames == 1 or self.dropped_frames % 1000 == 0:
                log.warning("dropped malformed message from broker (%s)", exc.reason)
            return True
        if isinstance(msg, BatchAssign):
            self._accept(
                Incoming(epoch=epoch, batch=msg, received_at=received_at),
                lambda frames: send_frames(sock, frames),
            )
        elif isinstance(msg, Disconnect):
            log.warning("broker asked us to reconnect: %s", msg.reason)
            return False
        # Heartbeats need no handling: hearing anything is what counts.
        return True

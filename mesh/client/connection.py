"""One client's link to one broker: the DEALER socket, its reader callback and its pinger.

Every request sent here ends exactly once: with its result, with the broker's error, with
Unavailable when the broker goes silent for ``liveness`` intervals or its connection closes
(a killed broker), or with DeadlineExceeded when the client-side deadline passes. Duplicate result chunks (possible after a requeue) are
dropped by sequence index.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from mesh.config import Liveness
from mesh.errors import MeshError, ProtocolViolation, Unavailable, error_from_code
from mesh.transport import (
    NOBLOCK,
    close_monitor,
    disconnect_monitor,
    disconnected_fds,
    readable,
    send_frames,
    waiting,
)
from proto_msgs import (
    BrokerStats,
    CancelRequest,
    CatalogReply,
    CatalogRequest,
    Message,
    ModelInfo,
    Ping,
    Pong,
    ProtocolError,
    RequestError,
    RequestResult,
    SubmitRequest,
    TokenizerReply,
    TokenizerRequest,
    decode,
    encode,
)
from proto_msgs.small_arrays import SMALL

log = logging.getLogger("embedmesh.client")

# Messages one wake-up of the reader handles before it yields the loop (and runs again next
# iteration): a flood of result chunks cannot stall the tasks that wait for them.
READ_BATCH = 256


@dataclass
class EmbedResult:
    """Embeddings in input order and the tokens they cost."""

    # [n, d]; float32, float16, int8 or uint8 (packed bits); a request with spans: [S, d],
    # its rows in span order (SubmitRequest.spans).
    embeddings: np.ndarray
    prompt_tokens: int
    queue_ms: float = 0.0  # the longest broker queue wait among its chunks
    compute_ms: float = 0.0  # the worker compute time of the batches that carried it
    # Per-hop durations in ms: the union over its chunks of RequestResult.timings (the largest
    # value of each name: the slowest batch is the one the caller waited for), plus this
    # client's "client_mesh" (submit sent → last chunk received).
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class _Pending:
    """A request in flight: assembles result chunks, drops duplicates."""

    future: asyncio.Future[Any]
    n: int
    tokens: int
    out: np.ndarray | None = None
    received: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    count: int = 0
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    sent_at: float = field(default_factory=time.perf_counter)
    span_offsets: np.ndarray | None = None  # the request's (SubmitRequest.span_offsets)
    # Sparse rows (k ids then k weights): each batch sends its own k, the most weights one of
    # its rows kept; narrower chunks are widened with pads (weight 0, never kept).
    sparse: bool = False

    def add(self, chunk: RequestResult) -> bool:
        """Store a chunk; True once every sequence has arrived."""
        if self.out is None and self._whole(chunk):
            # The usual answer, an idle query's every time: one chunk of every sequence in
            # order. A copy (the frame's buffer is read-only) instead of the range checks and
            # scatters below: 5 µs against 18 for one row on the 2-core VM.
            self.out = np.array(chunk.embeddings)
            self.received = np.ones(self.n, dtype=bool)
            self.count = self.n
            self._note(chunk)
            return True
        idx = chunk.indices.astype(np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n):
            raise ProtocolError("result index out of range")
        rows = self.n if self.span_offsets is None else int(self.span_offsets[-1])
        if self.out is None:
            empty = np.zeros if self.sparse else np.empty
            self.out = empty((rows, chunk.embeddings.shape[1]), dtype=chunk.embeddings.dtype)
            self.received = np.zeros(self.n, dtype=bool)
        elif chunk.embeddings.shape[1] != self.out.shape[1]:
            if not self.sparse:
                raise ProtocolError("result chunks disagree on width")
            width = max(chunk.embeddings.shape[1], self.out.shape[1])
            self.out = widen_sparse(self.out, width)
            chunk = dataclasses.replace(chunk, embeddings=widen_sparse(chunk.embeddings, width))
        fresh = ~self.received[idx]
        if self.span_offsets is not None or chunk.row_offsets is not None:
            self._add_span_rows(chunk, idx, fresh)
        elif fresh.all():
            self.out[idx] = chunk.embeddings
        else:
            self.out[idx[fresh]] = chunk.embeddings[fresh]
        self.received[idx[fresh]] = True
        self.count += int(fresh.sum())
        if fresh.all():
            self._note(chunk)
        return self.count == self.n

    def _whole(self, chunk: RequestResult) -> bool:
        """Whether ``chunk`` holds every sequence, in order, one row each."""
        if self.span_offsets is not None or chunk.row_offsets is not None:
            return False
        indices, n = chunk.indices, self.n
        if len(indices) != n:
            return False
        if n <= SMALL:  # numpy's fixed cost per call is the larger one for a few entries
            return bool(indices.tolist() == list(range(n)))
        return bool((indices == np.arange(n)).all())

    def _note(self, chunk: RequestResult) -> None:
        """Count a chunk's tokens and times: only a chunk whose every sequence is new."""
        self.prompt_tokens += chunk.prompt_tokens
        self.queue_ms = max(self.queue_ms, chunk.queue_ms)
        self.compute_ms += chunk.compute_ms
        for name, ms in chunk.timings.items():
            if ms > self.timings.get(name, -1.0):
                self.timings[name] = ms

    def _add_span_rows(self, chunk: RequestResult, idx: np.ndarray, fresh: np.ndarray) -> None:
        """A span request's chunk: each sequence's rows land where its spans say."""
        if self.span_offsets is None or chunk.row_offsets is None:
            raise ProtocolError("span rows for a request without spans, or the reverse")
        assert self.out is not None
        starts = self.span_offsets[idx].astype(np.int64)
        counts = self.span_offsets[idx + 1].astype(np.int64) - starts
        if not np.array_equal(np.diff(chunk.row_offsets.astype(np.int64)), counts):
            raise ProtocolError("result rows disagree with the request's spans")
        counts = np.where(fresh, counts, 0)
        first = chunk.row_offsets[:-1].astype(np.int64)
        # Every fresh row's place in the answer and in the chunk, without a loop over them.
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        self.out[np.repeat(starts, counts) + within] = chunk.embeddings[
            np.repeat(first, counts) + within
        ]

    def result(self) -> EmbedResult:
        assert self.out is not None
        self.timings["client_mesh"] = (time.perf_counter() - self.sent_at) * 1000
        return EmbedResult(
            self.out, self.prompt_tokens, self.queue_ms, self.compute_ms, self.timings
        )


def widen_sparse(rows: np.ndarray, width: int) -> np.ndarray:
    """Sparse rows ``[n, 2k]`` (k ids, then their k weights) as ``[n, width]``: each half
    zero-padded to ``width // 2``."""
    k, wide = rows.shape[1] // 2, width // 2
    if rows.shape[1] % 2 or width % 2 or wide < k:
        raise ProtocolError(f"sparse rows of width {rows.shape[1]} cannot widen to {width}")
    out = np.zeros((len(rows), width), dtype=rows.dtype)
    out[:, :k] = rows[:, :k]
    out[:, wide : wide + k] = rows[:, k:]
    return out


class BrokerConnection:
    """Owner of one DEALER socket to one broker frontend."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        liveness: Liveness,
        connect: Callable[[zmq.Socket, str], None] | None = None,
        on_catalog: Callable[[BrokerConnection], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.liveness = liveness
        self._connect = connect
        self._on_catalog = on_catalog
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._replies: dict[int, asyncio.Future[Message]] = {}
        self.models: list[ModelInfo] = []
        # False until this broker's catalog has arrived (again, after a loss or restart): its
        # empty ``models`` then means "not known yet", not "serves nothing".
        self.catalog_known = False
        self.stats: BrokerStats | None = None
        self.instance: int | None = None  # the broker process we talk to (from Pong)
        self.alive = False
        self.outstanding_tokens = 0
        self.dropped = 0
        # Times this link lost its broker or found it restarted (its requests failed over).
        self.failovers = 0
        self._last_heard = 0.0
        # A plain socket read from the loop's reader callback (``_on_readable``): the results
        # come out of the socket, are decoded and resolve their futures in one callback, where
        # a zmq.asyncio socket took a recv future, a reader task's wake-up and per-message
        # EVENTS checks for each (0.08-0.14 ms of an idle query's round trip on a 2-core VM).
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None  # the socket's disconnects (a killed broker)
        self._reopen = False  # a fresh socket is owed (opening one failed after a loss)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._alive_event = asyncio.Event()

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._open()
        self._tasks = [asyncio.create_task(self._ping_loop(), name=f"pinger {self.endpoint}")]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.alive = False  # a submit after close is refused as Unavailable, not an assert
        self._alive_event.clear()
        self._fail_all(Unavailable(f"client closed its link to {self.endpoint}"))
        if self._sock is not None:
            if self._monitor is not None:
                self._close_monitor(self._sock, self._monitor)
                self._monitor = None
            self._close_socket(self._sock)
            self._sock = None

    async def wait_alive(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._alive_event.wait(), timeout_s)
        return self.alive

    def _open(self) -> None:
        sock = self.ctx.socket(zmq.DEALER, socket_class=zmq.Socket)
        monitor: zmq.Socket | None = None
        try:
            sock.setsockopt(zmq.LINGER, 0)
            if self._connect is not None:
                self._connect(sock, self.endpoint)
            else:
                sock.connect(self.endpoint)
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            monitor = disconnect_monitor(sock)
            self._loop.add_reader(sock.FD, self._on_readable)
            self._loop.add_reader(monitor.FD, self._on_monitor)
            # zmq's FD signals edges only after its events were read once: read them now.
            self._loop.call_soon(self._on_monitor)
        except BaseException:
            # Half built: neither kept nor leaked, and no reader left on a closed descriptor.
            if monitor is not None:
                self._close_monitor(sock, monitor)
            self._close_socket(sock)
            raise
        if self._sock is not None and self._monitor is not None:
            self._close_monitor(self._sock, self._monitor)
        self._sock, self._monitor = sock, monitor

    def _close_socket(self, sock: zmq.Socket) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(ValueError, OSError, zmq.ZMQError):
                self._loop.remove_reader(sock.FD)
        sock.close(linger=0)

    def _close_monitor(self, sock: zmq.Socket, monitor: zmq.Socket) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(ValueError, OSError, zmq.ZMQError):
                self._loop.remove_reader(monitor.FD)
        close_monitor(sock, monitor)

    def _on_monitor(self) -> None:
        """The connection to the broker closed (its process died, its host answered): what it
        held for this connection is gone, so its requests fail now rather than after the
        liveness window. ZeroMQ reconnects on its own; the next reply marks it alive again."""
        monitor = self._monitor
        if monitor is None or monitor.closed:
            return
        with contextlib.suppress(zmq.ZMQError):
            if disconnected_fds(monitor) and self.alive:
                self._lost(f"its connection to {self.endpoint} closed")

    def _send(self, msg: Message) -> None:
        if self._sock is None:
            raise Unavailable(f"the link to broker {self.endpoint} is closed")
        try:
            # DEALER send never blocks here unless the HWM is hit; NOBLOCK turns that into
            # an immediate Unavailable instead of an unbounded wait.
            send_frames(self._sock, encode(msg), NOBLOCK)
        except zmq.Again as exc:
            raise Unavailable(f"broker {self.endpoint} is not accepting messages") from exc
        finally:
            # zmq's FD signals edges, and a send may take the edge of a message that arrived
            # meanwhile: look again, or that message would wait for the next one.
            self._check_readable()

    # ---- requests -----------------------------------------------------------------------------

    def submit(self, request: SubmitRequest, tokens: int) -> _Pending:
        if not self.alive:
            raise Unavailable(f"broker {self.endpoint} is unreachable")
        loop = asyncio.get_running_loop()
        pending = _Pending(
            future=loop.create_future(), n=request.n, tokens=tokens,
            span_offsets=request.span_offsets, sparse=request.output.kind == "sparse",
        )  # fmt: skip
        self._pending[request.cid] = pending
        self.outstanding_tokens += tokens
        try:
            self._send(request)
        except MeshError:
            self._finish(request.cid)
            raise
        pending.sent_at = time.perf_counter()  # after the encode: "client_mesh" is the wire's
        return pending

    def next_cid(self) -> int:
        return next(self._ids)

    def cancel(self, cid: int) -> None:
        if self._finish(cid) is not None and self.alive:
            with contextlib.suppress(MeshError, zmq.ZMQError):
                self._send(CancelRequest(cid=cid))

    async def ask(self, msg: CatalogRequest | TokenizerRequest | Ping, timeout_s: float) -> Message:
        """Send a control request and wait for its reply (matched by cid)."""
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._replies[msg.cid] = fut
        try:
            self._send(msg)
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError as exc:
            raise Unavailable(f"broker {self.endpoint} did not answer") from exc
        finally:
            self._replies.pop(msg.cid, None)

    def _finish(self, cid: int) -> _Pending | None:
        pending = self._pending.pop(cid, None)
        if pending is not None:
            self.outstanding_tokens -= pending.tokens
        return pending

    def _fail_all(self, error: MeshError) -> None:
        for cid in list(self._pending):
            pending = self._finish(cid)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(error)
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(error)
        self._replies.clear()

    # ---- tasks --------------------------------------------------------------------------------

    def _check_readable(self) -> None:
        """Schedule the reader when the socket holds a message its FD may not signal."""
        sock = self._sock
        if sock is None or sock.closed or self._loop is None:
            return
        with contextlib.suppress(zmq.ZMQError):
            if readable(sock):
                self._loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        """The loop's reader callback: handle what the socket holds (at most READ_BATCH
        messages, then again next iteration)."""
        sock = self._sock
        if sock is None or sock.closed:
            return
        try:
            for frames in waiting(sock, limit=READ_BATCH):
                self._heard()
                cid = None
                try:
                    msg = decode(frames)
                    # A chunk that does not fit its request (an index out of range, another
                    # width) fails in _dispatch, with no cid on the error: it is the message's.
                    cid = getattr(msg, "cid", None)
                    self._dispatch(msg)
                except ProtocolError as exc:
                    self._malformed(exc, exc.cid if exc.cid is not None else cid)
                if sock is not self._sock:
                    return  # replaced meanwhile (_lost): its messages are stale
        except zmq.ZMQError:
            if sock is self._sock and not sock.closed:
                raise
            return
        finally:
            # Messages left (the batch limit, or an exception above) get no new edge.
            if sock is self._sock:
                self._check_readable()

    def _malformed(self, exc: ProtocolError, cid: int | None) -> None:
        """A reply that could not be used: dropped, and the request it names (if any) fails
        now instead of waiting out its deadline."""
        self.dropped += 1
        if self.dropped == 1:
            log.warning("dropped malformed message from %s: %s", self.endpoint, exc)
        pending = self._finish(cid) if isinstance(cid, int) else None
        if pending is not None and not pending.future.done():
            pending.future.set_exception(ProtocolViolation(f"malformed reply: {exc.reason}"))

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, RequestResult):
            pending = self._pending.get(msg.cid)
            if pending is not None and pending.add(msg):
                self._finish(msg.cid)
                if not pending.future.done():
                    pending.future.set_result(pending.result())
        elif isinstance(msg, RequestError):
            pending = self._finish(msg.cid)
            if pending is not None and not pending.future.done():
                retry = msg.retry_after_ms / 1000 if msg.retry_after_ms is not None else None
                pending.future.set_exception(error_from_code(msg.code, msg.message, retry))
        elif isinstance(msg, Pong | CatalogReply | TokenizerReply):
            if isinstance(msg, Pong):
                if self.instance is not None and msg.instance != self.instance:
                    self._restarted()
                self.instance = msg.instance
                self.stats = msg.stats
            elif isinstance(msg, CatalogReply):
                self.models = msg.models
                self.catalog_known = True
                if self._on_catalog is not None:
                    self._on_catalog(self)
            fut = self._replies.get(msg.cid)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        else:
            self.dropped += 1

    def sound(self) -> bool:
        """False once the pinger ended (it only ends on close or a bug): the link is dead."""
        return not any(task.done() for task in self._tasks)

    def heard_ago(self) -> float | None:
        """Seconds since this broker last sent anything; None if it never did."""
        return time.monotonic() - self._last_heard if self._last_heard else None

    def _heard(self) -> None:
        self._last_heard = time.monotonic()
        if not self.alive:
            self.alive = True
            self._alive_event.set()
            log.info("broker %s is reachable", self.endpoint)
            with contextlib.suppress(MeshError):
                self._send(CatalogRequest(cid=self.next_cid()))

    async def _ping_loop(self) -> None:
        interval = self.liveness.interval_s
        while True:
            # Fire and forget: replies are handled by the reader, so a dead broker never
            # stretches this loop and the silence check below runs every interval.
            with contextlib.suppress(MeshError):
                self._send(Ping(cid=self.next_cid()))
                self._send(CatalogRequest(cid=self.next_cid()))
            await asyncio.sleep(interval)
            if self.alive and time.monotonic() - self._last_heard > self.liveness.expiry_s:
                self._lost(f"silent for {self.liveness.expiry_s:.1f}s")
            elif self._reopen:
                self._replace_socket()

    def _restarted(self) -> None:
        """The broker restarted within the liveness window: what it held is gone."""
        log.warning("broker %s restarted: failing its requests", self.endpoint)
        self.failovers += 1
        self.models = []
        self.catalog_known = False
        self._fail_all(Unavailable(f"the broker at {self.endpoint} restarted; retry"))
        with contextlib.suppress(MeshError):
            self._send(CatalogRequest(cid=self.next_cid()))

    def _lost(self, why: str = "silent") -> None:
        log.warning("broker %s lost (%s): failing its requests", self.endpoint, why)
        self.failovers += 1
        self.alive = False
        self._alive_event.clear()
        self.models = []
        self.catalog_known = False
        self.instance = None
        self._fail_all(Unavailable(f"lost the broker at {self.endpoint}; retry"))
        self._replace_socket()

    def _replace_socket(self) -> None:
        """A fresh socket: the old one's queue would replay stale submits to a new broker.
        Opened before the old one closes: if opening fails (no file descriptor left, say),
        the old one stays, pinging, and the next interval tries again; an exception here
        would end the pinger, and with it every chance of this link coming back."""
        old = self._sock
        try:
            self._open()
        except (zmq.ZMQError, OSError) as exc:
            if not self._reopen:
                log.warning("could not open a new socket to %s (%s); keeping the old one and "
                            "trying again each ping interval", self.endpoint, exc)  # fmt: skip
            self._reopen = True
            return
        self._reopen = False
        if old is not None:
            self._close_socket(old)

"""Run one ingress until told to stop: the HTTP site, the mesh client, a graceful drain.

The drain, on ``stop`` (SIGTERM or SIGINT):

1. the listening socket closes first, so a new connection is refused by the kernel;
2. a request that arrives later on a kept-alive connection gets a 503 in the JSON error shape
   with ``Connection: close``, and so does every response from then on: no client reuses a
   connection that is about to close, which would end in a bare disconnect;
3. accepted requests run to the end, for up to ``drain_grace_s``; idle kept-alive connections
   stay open until then (or until IDLE_LINGER_S after the last request arrived), so that a
   client sending on one gets that 503 rather than a reset;
4. then the connections close, what still runs after the grace is cancelled, and the mesh
   client closes.

Every request body must also arrive within ``body_timeout_s`` of its headers, else 408; a file
upload (``POST /v1/files``, up to ``--max-batch-file-bytes``) only has to keep arriving, at
UPLOAD_MIN_RATE at least over each ``body_timeout_s`` (periods in which the server had not read
what came are not counted), else 408. The headers' own timeout, the idle timeout and the cap
on open connections: ``mesh.ingress.connections``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable

import zmq
from aiohttp import web

from mesh.client import MeshClient
from mesh.ingress.app import LIVENESS_PATH, STATE, create_app
from mesh.ingress.config import IngressConfig
from mesh.ingress.connections import Guard, GuardedSite, handler_kwargs, raise_fd_limit
from mesh.ingress.files import UPLOAD_PATH
from mesh.ingress.http_errors import ApiError, error_response, route_family
from mesh.ingress.metrics import multiprocess_dir

log = logging.getLogger("embedmesh.ingress")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# After the drain grace, handlers still running get this long to notice their cancellation
# before aiohttp closes their connections; 0.5..5 is reasonable.
CUT_S = 1.0
# During a drain with nothing in flight, idle kept-alive connections stay open this long after
# the last request came in: a client that was about to send on one gets a 503 and
# "Connection: close" instead of a reset. 0.2..2 is reasonable.
IDLE_LINGER_S = 0.5
DRAIN_POLL_S = 0.05
# The slowest an upload may arrive, over each body_timeout_s: 16 KiB/s takes a 200 MiB file in
# 3.6 h; a client trickling bytes to hold an upload thread is cut off. 4..256 KiB/s.
UPLOAD_MIN_RATE = 16 * 1024
# How often one of several processes writes its per-process gauges for scrapes that reach the
# others; 0.5..5 s is reasonable (a scrape interval is 15 s or more).
PUBLISH_INTERVAL_S = 1.0


async def serve(
    cfg: IngressConfig,
    stop: asyncio.Event,
    connect: Callable[[zmq.Socket, str], None] | None = None,
) -> None:
    """Serve HTTP on ``cfg.http_host:cfg.http_port`` until ``stop`` is set, then drain (see
    the module's docstring): refuse new work, let accepted requests finish within
    ``cfg.drain_grace_s``, close the connections and the client."""
    client = MeshClient(
        cfg.brokers,
        liveness=cfg.liveness,
        tokenizer_threads=cfg.tokenizer_threads,
        tokenize_processes=cfg.tokenize_processes,
        connect=connect,
        default_timeout_s=cfg.request_timeout_s,
        prefetch_tokenizers=True,
    )
    await client.start()
    app = create_app(cfg, client)
    gate = Gate(cfg.body_timeout_s)
    # Inside the app's first middleware (which counts and times every request, so 408 and 503
    # are counted) and outside its error mapping (our answers are final).
    app.middlewares.insert(1, gate.middleware)
    guard = Guard(cfg.connection_limits)
    kwargs = handler_kwargs(guard.limits)  # the idle timeout, no access log
    raise_fd_limit(guard.limits.max_connections)
    # handler_cancellation: a client that hangs up cancels its handler, hence its mesh work.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=CUT_S,  # our drain has already waited the grace
        **kwargs,
    )
    # One of several processes: keep our share of the per-process gauges fresh for scrapes
    # that reach a sibling. Alone, a scrape of this process refreshes them itself.
    publisher = asyncio.create_task(_publish_metrics(app)) if multiprocess_dir() else None
    try:
        await runner.setup()
        await _wait_catalog(client, cfg.liveness.expiry_s)
        site = GuardedSite(
            runner, cfg.http_host, cfg.http_port, guard, kwargs, reuse_port=cfg.reuse_port
        )
        await site.start()
        if cfg.api_key is None and not _is_loopback(cfg.http_host):
            log.warning("listening on %s without --api-key: anyone who can reach it can use it",
                        cfg.http_host)  # fmt: skip
        log.info("ingress up: http://%s:%d (brokers %s)", cfg.http_host, cfg.http_port,
                 ", ".join(cfg.brokers))  # fmt: skip
        await stop.wait()
        log.info("ingress draining: new connections refused, up to %.0fs for %d in flight",
                 cfg.drain_grace_s, gate.in_flight)  # fmt: skip
        await _drain(runner, gate, cfg.drain_grace_s)
    finally:
        if publisher is not None:
            publisher.cancel()
        await runner.cleanup()
        await client.close()
        log.info("ingress stopped")


async def _wait_catalog(client: MeshClient, wait_s: float) -> None:
    """Until a broker has listed its models, for up to ``wait_s`` (a mesh without workers yet
    must still answer /health). A process restarted beside serving siblings would otherwise
    take connections at once and answer its first requests 404, before the catalog came."""
    deadline = time.monotonic() + wait_s
    while not client.models() and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)


class Gate:
    """The middleware that knows what a stop needs: how many requests are in flight and
    whether we drain; and that bounds how long a request body may take to arrive."""

    def __init__(self, body_timeout_s: float) -> None:
        self.body_timeout_s = body_timeout_s
        self.draining = False
        self.in_flight = 0
        self.last_arrival = time.monotonic()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.last_arrival = time.monotonic()
        # Liveness is answered while draining too: a draining process is sound, and a probe
        # that restarted it would cut the drain short.
        if self.draining and request.path != LIVENESS_PATH:
            return await self._refuse(request)
        self.in_flight += 1
        try:
            response = await self._within_body_timeout(request, handler)
        finally:
            self.in_flight -= 1
        if self.draining:
            response.force_close()  # "Connection: close": the client must not send here again
        return response

    async def _within_body_timeout(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Run ``handler``; if the body has not fully arrived ``body_timeout_s`` after the
        headers (an upload: if no byte of it came for that long), cancel it (it waits in its
        read) and answer 408 on a closing connection."""
        if request.content.is_eof():  # no body, or all of it is here already
            return await handler(request)
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        upload = _is_upload(request)
        expired = False
        seen = request.content.total_bytes
        timer: asyncio.TimerHandle

        def expire() -> None:
            nonlocal expired, seen, timer
            if request.content.is_eof():
                return
            got = request.content.total_bytes - seen
            # Bytes received but not read yet: the server is the slow side, not the client.
            waiting = getattr(request.content, "_size", 0) > 0
            if upload and (waiting or got >= UPLOAD_MIN_RATE * self.body_timeout_s):
                seen += got  # still coming: another period
                timer = loop.call_later(self.body_timeout_s, expire)
                return
            expired = True
            task.cancel()

        timer = loop.call_later(self.body_timeout_s, expire)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            if not expired:
                raise  # the client hung up, or the server stops: not ours
            task.uncancel()
        finally:
            timer.cancel()
        return await self._timed_out(request)

    async def _timed_out(self, request: web.Request) -> web.StreamResponse:
        """408, written out before the connection closes: aiohttp would otherwise linger up
        to 10 s reading the rest of a body that is not coming."""
        upload = _is_upload(request)
        err = ApiError(
            408,
            f"the upload arrived slower than {UPLOAD_MIN_RATE // 1024} KiB/s over "
            f"{self.body_timeout_s:g}s"
            if upload
            else f"the request body did not arrive within {self.body_timeout_s:g}s of its headers",
            code="request_timeout",
        )
        response = error_response(err, route_family(request))
        response.force_close()
        with contextlib.suppress(ConnectionError):
            await response.prepare(request)
            await response.write_eof()
        request.protocol.force_close()  # closes after the buffered 408 is sent
        return response

    async def _refuse(self, request: web.Request) -> web.StreamResponse:
        """503 for a request that arrived after the drain began. Its body is read first:
        closing a socket with unread data sends a reset, which can destroy the 503 on its way
        to the client."""
        # Any failure to read (too large, malformed, too slow) changes nothing: we close.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.body_timeout_s):
                await request.read()
        err = ApiError(
            503,
            "this server is shutting down; retry on a new connection",
            "server_error",
            "unavailable",
        )
        response = error_response(err, route_family(request))
        response.force_close()
        return response


def _is_upload(request: web.Request) -> bool:
    """A file upload: its body only has to keep arriving (the module docstring)."""
    return request.method == "POST" and request.path == UPLOAD_PATH


async def _drain(runner: web.AppRunner, gate: Gate, grace_s: float) -> None:
    """Close the listening sockets, refuse what comes later on open connections and wait,
    up to ``grace_s``, for the accepted requests (see the module's docstring)."""
    for site in list(runner.sites):
        await site.stop()  # the listener first: from here the kernel refuses connections
    gate.draining = True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if gate.in_flight == 0 and (
            not (runner.server and runner.server.connections)
            or time.monotonic() - gate.last_arrival >= IDLE_LINGER_S
        ):
            return
        await asyncio.sleep(DRAIN_POLL_S)
    if gate.in_flight:
        log.warning("drain grace of %.0fs over: cancelling %d requests still in flight",
                    grace_s, gate.in_flight)  # fmt: skip


async def _publish_metrics(app: web.Application) -> None:
    """Write this process's per-process gauges every PUBLISH_INTERVAL_S."""
    metrics = app[STATE].metrics
    while True:
        metrics.publish()
        await asyncio.sleep(PUBLISH_INTERVAL_S)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

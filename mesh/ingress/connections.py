"""What one ingress process allows a TCP connection: a header-read timeout, an idle timeout and
a cap on the connections it holds open.

- **Header timeout** (``--header-timeout``): once the first byte of a request has arrived, its
  request line and headers must be complete within this long, else the connection gets a 408
  and is closed. A client that trickles a header line every few seconds (slowloris) holds a
  connection for this long at most. The body has its own bound (``--body-timeout``,
  ``mesh.ingress.server``).
- **Idle timeout** (``--idle-timeout``): a connection with no request running (a fresh one
  that has sent nothing, or a kept-alive one between requests) is closed after this long.
  aiohttp's keep-alive timer does this; a load balancer in front should keep its own idle
  timeout below ours, so that it never sends on a connection we are closing.
- **Connection cap** (``--max-connections``): with that many connections open, a new one is
  answered at once with a 503 (``Retry-After: 1``, ``Connection: close``, the OpenAI error
  shape) and closed; it never reaches the application. Whatever it sent is read and dropped
  for up to REFUSED_LINGER_S so that the close is not a reset that would destroy the 503. As
  connections close, new ones are accepted again. The cap is per process: ``--ingress-procs
  N`` processes sharing a port hold up to N times as many.

The listening socket is made by :class:`GuardedSite` (aiohttp's ``TCPSite`` with our protocol
factory), each connection's protocol is a :class:`GuardedHandler` (aiohttp's own
``RequestHandler`` with the header timer and the cap).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from typing import Any, cast

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from mesh.ingress.config import ConnectionLimits

log = logging.getLogger("embedmesh.ingress")

# How long a refused connection is read (and its bytes dropped) after its 503, before closing:
# a close with unread bytes is a reset, which can reach the client before the 503. 0.2..5.
REFUSED_LINGER_S = 1.0
# File descriptors kept beyond the cap for the process's own sockets and files.
SPARE_FDS = 256
# Refusals at the cap are logged at most once per this many seconds (a flood must not flood
# the log too); 1..300 is reasonable.
REFUSAL_LOG_S = 10.0


def _raw_error(status: int, reason: str, message: str, code: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 error response that closes its connection, in the OpenAI shape."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Guard:
    """The limits and the count of open connections of one process's listening sockets."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0  # connections accepted and not yet lost
        self.refused = 0  # connections refused at the cap, since start
        self.header_timeouts = 0  # connections closed by the header timeout, since start
        self._logged_at = -REFUSAL_LOG_S
        self._logged_refused = 0
        self.refusal = _raw_error(
            503,
            "Service Unavailable",
            f"this server holds its maximum of {limits.max_connections} connections; retry",
            "too_many_connections",
            "Retry-After: 1\r\n",
        )
        self.timeout_response = _raw_error(
            408,
            "Request Timeout",
            f"the request headers did not arrive within {limits.header_timeout_s:g}s",
            "request_timeout",
        )

    def note_refusal(self, now: float) -> None:
        """Count a connection refused at the cap; say so in the log now and then."""
        self.refused += 1
        if now - self._logged_at >= REFUSAL_LOG_S:
            log.warning("%d connections open, the most this process holds (--max-connections):"
                        " %d new ones refused with 503 since the last such line",
                        self.open, self.refused - self._logged_refused)  # fmt: skip
            self._logged_at, self._logged_refused = now, self.refused


class GuardedHandler(RequestHandler):
    """aiohttp's connection protocol, with the header timer and the connection cap."""

    __slots__ = ("_guard", "_header_timer", "_refused", "_counted")

    def __init__(self, manager: web.Server, guard: Guard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused: asyncio.Transport | None = None
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.limits.max_connections:
            guard.note_refusal(self._loop.time())
            # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
            self._refuse(cast(asyncio.Transport, transport))
            return
        guard.open += 1
        self._counted = True
        super().connection_made(transport)

    def _refuse(self, transport: asyncio.Transport) -> None:
        """503 at once, then stop writing; read and drop what comes until the client closes
        or REFUSED_LINGER_S passes."""
        self._refused = transport
        transport.write(self._guard.refusal)
        with contextlib.suppress(OSError, NotImplementedError, RuntimeError):
            transport.write_eof()
        self._loop.call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return  # read and dropped
        before = self._request_count
        # Between requests: none parsed yet on this connection, or the handler's loop waits
        # for the next one. Not while a body arrives or a request runs (its waiter is gone).
        waiter = self._waiter
        between = before == 0 or (waiter is not None and not waiter.done())
        super().data_received(data)
        if self._request_count != before:  # a request's headers are complete
            self._disarm()
        elif data and between and self._header_timer is None:
            timeout = self._guard.limits.header_timeout_s  # from a request's first byte
            self._header_timer = self._loop.call_later(timeout, self._headers_too_slow)

    def eof_received(self) -> bool | None:
        if self._refused is not None:
            self._refused.close()
            return None
        return super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused is not None:
            self._refused = None
            return
        self._disarm()
        if self._counted:
            self._counted = False
            self._guard.open -= 1
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is None or self._request_in_progress:
            return
        self._guard.header_timeouts += 1
        transport.write(self._guard.timeout_response)
        self.force_close()  # the transport sends what it buffered, then closes


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections are :class:`GuardedHandler`\\ s under one Guard.
    ``handler_kwargs``: what the runner was given for its request handlers (keep-alive, access
    log), passed to each handler the same way."""

    __slots__ = ("guard", "_handler_kwargs")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: Guard,
        handler_kwargs: dict[str, Any],
        *,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, host, port, reuse_address=True, reuse_port=reuse_port)
        self.guard = guard
        self._handler_kwargs = handler_kwargs

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard, kwargs = self.guard, self._handler_kwargs

        def protocol() -> GuardedHandler:
            return GuardedHandler(server, guard, loop=loop, **kwargs)

        self._server = await loop.create_server(
            protocol,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


def handler_kwargs(limits: ConnectionLimits) -> dict[str, Any]:
    """The request handlers' options of an ingress: its idle timeout, no access log (/metrics
    counts every request; a log line each costs at load)."""
    return {"keepalive_timeout": limits.idle_timeout_s, "access_log": None}


def raise_fd_limit(max_connections: int) -> None:
    """Lift the soft limit on open files towards the cap (up to the hard limit): the common
    soft limit of 1024 would refuse connections with EMFILE long before a cap of 4096."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + SPARE_FDS
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < max_connections + SPARE_FDS:
        log.warning("open files are limited to %d: fewer connections than --max-connections "
                    "%d can be open (raise ulimit -n)", soft, max_connections)  # fmt: skip

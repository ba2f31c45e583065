"""Sockets at the edges: the one place that binds, connects and secures zmq sockets (DESIGN §7).

Loopback endpoints (127.0.0.0/8, ``localhost``, ``[::1]``, ``ipc://``, ``inproc://``) may run in
the clear. Any other listening endpoint needs CurveZMQ server keys, or an explicit ``insecure``
(``--insecure``), else ``secure_bind`` raises ``InsecureBindError``. With keys, clients are
checked against an allow-list of public keys (every ``*.key`` file in a folder) by a ZAP handler,
``CurveAuth``, which a server starts once per zmq context before binding.

Keys are the files of ``zmq.auth.create_certificates``: ``NAME.key`` (public, safe to copy to
other hosts) and ``NAME.key_secret`` (both keys, mode 0600). ``generate_keys`` lays a folder out
for one mesh; a worker host needs only its own ``worker.key_secret`` and ``broker.key``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from proto_msgs import limits

log = logging.getLogger("embedmesh.transport")

# Messages queued per peer before send blocks (DEALER) or drops (ROUTER), and before reading
# stops. 0 (unlimited) would let one peer that stops reading grow this process without bound;
# zmq's default of 1000 could drop results on a busy ROUTER, which drops silently at its HWM.
# Credits and admission bound the real traffic far below this; 10k..1M is reasonable.
SEND_HWM = 100_000
RECV_HWM = 100_000
# TCP keepalive keeps idle links through NAT and firewalls and lets the kernel drop dead peers;
# liveness itself is the heartbeats' job. Idle 30..300 s is reasonable.
TCP_KEEPALIVE_IDLE_S = 60
TCP_KEEPALIVE_INTERVAL_S = 10
TCP_KEEPALIVE_COUNT = 3
DEFAULT_KEY_NAMES = ("broker", "ingress", "worker")


class InsecureBindError(RuntimeError):
    """Listening on a non-loopback endpoint in the clear, without being told to."""


@dataclass
class CurveServerKeys:
    """A listening side's key pair; ``allowed_clients_dir`` holds the public ``*.key`` files of
    the clients let in (None: any client that knows the server's public key)."""

    public: bytes
    secret: bytes
    allowed_clients_dir: Path | None


@dataclass
class CurveClientKeys:
    """A connecting side's key pair and the public key of the server it talks to."""

    public: bytes
    secret: bytes
    server_public: bytes


# ---- endpoints ---------------------------------------------------------------------------------


def _tcp_host(endpoint: str) -> str | None:
    """The host of a ``tcp://`` endpoint (brackets removed), or None for other transports."""
    transport, sep, address = endpoint.partition("://")
    if not sep or transport.lower() != "tcp":
        return None
    address = address.rpartition(";")[2]  # connect form "tcp://source;peer": the peer counts
    if address.startswith("["):
        return address[1:].partition("]")[0]
    return address.rpartition(":")[0] if ":" in address else address


def is_loopback(endpoint: str) -> bool:
    """True when ``endpoint`` cannot be reached from another host (ipc and inproc included).

    ``tcp://*:p``, ``tcp://0.0.0.0:p``, interface names and DNS names other than ``localhost``
    are not loopback: they may (or may resolve to something that may) listen on the network.
    """
    transport = endpoint.partition("://")[0].lower()
    if transport in ("ipc", "inproc"):
        return True
    host = _tcp_host(endpoint)
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 (Python 3.11 does not call it loopback)
    return ip.is_loopback


def _is_ipv6(endpoint: str) -> bool:
    host = _tcp_host(endpoint)
    return host is not None and ":" in host


# ---- socket options ----------------------------------------------------------------------------


# pyzmq's flags and options are IntFlag enums: every ``|`` or ``&`` on one builds an enum
# member (~1.8 µs on the 2-core VM), and send_multipart does one per frame, recv_multipart an
# option lookup per frame. As plain ints they cost nothing: 27 enum calls an idle query
# in the broker alone.
_SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags, copy=False)``, the same frames on the wire, at
    plain-int flags: ~2.5 µs a frame less, 11 frames an idle query in the broker."""
    for i, frame in enumerate(frames):
        # Checked before the first send, as send_multipart does: a frame refused after
        # SNDMORE would leave half a message that the next send completes.
        if not isinstance(frame, (zmq.Frame, bytes, memoryview)):
            try:
                memoryview(frame)
            except Exception as exc:
                raise TypeError(f"Frame {i} does not support the buffer interface.") from exc
    send, more, last = sock.send, flags | _SNDMORE, len(frames) - 1
    for i in range(last):
        send(frames[i], more, copy=False)
    send(frames[last], flags, copy=False)


def readable(sock: zmq.Socket) -> bool:
    """Whether ``sock`` holds a message now (``zmq.EVENTS``), at plain-int options."""
    return bool(sock.get(_EVENTS) & _POLLIN)


def waiting(sock: zmq.Socket, limit: int | None = None) -> Iterator[list[zmq.Frame]]:
    """The messages ``sock`` holds now (at most ``limit``), read without blocking, as
    zero-copy frames. ``zmq.EVENTS`` is asked before each read: ending on a raised
    ``zmq.Again`` cost ~15 µs a wake-up (its ``__init__`` imports and formats), which the
    broker and the worker link each paid twice per idle query."""
    count = 0
    while (limit is None or count < limit) and readable(sock):
        try:
            frame = sock.recv(NOBLOCK, copy=False)
            frames = [frame]
            # recv_multipart asks the RCVMORE option per frame; the Frame already says it.
            while frame.more:
                frame = sock.recv(NOBLOCK, copy=False)
                frames.append(frame)
        except zmq.Again:
            return
        count += 1
        yield frames


def disconnect_monitor(sock: zmq.Socket) -> zmq.Socket:
    """A plain PAIR socket that receives ``sock``'s EVENT_DISCONNECTED events: a connection
    closed by its peer's host (a killed process), seen at once. A silent partition closes
    nothing; the heartbeats' liveness window finds those. Close it with ``close_monitor``."""
    address = f"inproc://embedmesh-monitor-{id(sock):x}-{os.getpid()}"
    sock.monitor(address, zmq.EVENT_DISCONNECTED)
    # Made here rather than by get_monitor_socket: a socket of an asyncio context would give an
    # asyncio PAIR, and the owners read this one from a poller or a loop reader callback.
    monitor = zmq.Socket(sock.context, zmq.PAIR)
    try:
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
    except BaseException:
        close_monitor(sock, monitor)  # half made (no descriptor left, say): nothing leaks
        raise
    return monitor


def close_monitor(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    if not sock.closed:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
    monitor.close(linger=0)


def disconnected_fds(monitor: zmq.Socket) -> list[int]:
    """The descriptors of the connections closed since the last call, read without blocking."""
    from zmq.utils.monitor import parse_monitor_message

    fds: list[int] = []
    while readable(monitor):
        try:
            event = parse_monitor_message(monitor.recv_multipart(NOBLOCK))
        except (zmq.Again, ValueError):
            break
        if event["event"] == zmq.EVENT_DISCONNECTED:
            fds.append(int(event["value"]))
    return fds


def set_common_options(sock: zmq.Socket, endpoint: str | None = None) -> None:
    """Options every mesh socket gets, before it binds or connects."""
    # Unsent messages are dropped at close: delivery is at-least-once through requeues, so
    # lingering would only make shutdown hang on a dead peer.
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, SEND_HWM)
    sock.setsockopt(zmq.RCVHWM, RECV_HWM)
    # A peer sending a frame larger than decode would accept is disconnected before zmq
    # allocates it.
    sock.setsockopt(zmq.MAXMSGSIZE, limits.MAX_ARRAY_BYTES)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_IDLE_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, TCP_KEEPALIVE_INTERVAL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, TCP_KEEPALIVE_COUNT)
    if endpoint is not None and _is_ipv6(endpoint):
        sock.setsockopt(zmq.IPV6, 1)


def secure_bind(
    sock: zmq.Socket, endpoint: str, server_keys: CurveServerKeys | None, insecure: bool = False
) -> str:
    """Bind ``sock`` as a CURVE server when keys are given; refuse a non-loopback endpoint
    without keys unless ``insecure``. Returns the endpoint bound (with the port zmq chose for
    ``:*``)."""
    if server_keys is None:
        if not is_loopback(endpoint):
            if not insecure:
                raise InsecureBindError(
                    f"refusing to listen on {endpoint} in the clear: it is reachable from other "
                    "hosts. Pass CURVE keys (mesh-launch --curve-dir DIR) to encrypt and "
                    "authenticate, or --insecure to listen without them on a trusted network."
                )
            log.warning("listening on %s WITHOUT encryption or authentication", endpoint)
    else:
        allowed = server_keys.allowed_clients_dir
        if allowed is not None and not CurveAuth.running_for(sock.context):
            # Without a ZAP handler libzmq lets every CURVE client in: fail closed instead.
            raise RuntimeError(f"start CurveAuth for this context before binding {endpoint}")
        if allowed is None:
            log.warning(
                "%s: CURVE without an allow-list; any client with our key gets in", endpoint
            )
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, server_keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, server_keys.secret)
        # No ZAP_DOMAIN: zmq.auth files the allow-list under "*", the domain of sockets that
        # set none ("*" is a default there, not a wildcard).
    set_common_options(sock, endpoint)
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def secure_connect(sock: zmq.Socket, endpoint: str, client_keys: CurveClientKeys | None) -> None:
    """Connect ``sock``, as a CURVE client when keys are given."""
    if client_keys is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, client_keys.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, client_keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, client_keys.secret)
    elif not is_loopback(endpoint):
        log.warning("connecting to %s WITHOUT encryption or authentication", endpoint)
    set_common_options(sock, endpoint)
    sock.connect(endpoint)


# ---- keys --------------------------------------------------------------------------------------


def generate_keys(directory: Path | str, names: Iterable[str] = DEFAULT_KEY_NAMES) -> Path:
    """Create ``NAME.key`` / ``NAME.key_secret`` in ``directory`` for each name that has none.

    Existing pairs are kept, so calling it at every launch never invalidates deployed keys.
    """
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in names:
        secret = directory / f"{name}.key_secret"
        if secret.exists():
            continue
        zmq.auth.create_certificates(directory, name)
        os.chmod(secret, 0o600)
    return directory


def _load_pair(directory: Path, name: str) -> tuple[bytes, bytes]:
    path = Path(directory) / f"{name}.key_secret"
    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{path} holds no secret key")
    if path.stat().st_mode & 0o077:
        log.warning("%s is readable by other users; chmod 600 it", path)
    return public, secret


def load_server_keys(
    directory: Path | str, name: str = "broker", allowed_clients_dir: Path | str | None = None
) -> CurveServerKeys:
    """``name``'s key pair from ``directory``; clients allowed are the ``*.key`` files of
    ``allowed_clients_dir`` (by default ``directory`` itself: the keys of this mesh)."""
    directory = Path(directory)
    public, secret = _load_pair(directory, name)
    allowed = Path(allowed_clients_dir) if allowed_clients_dir is not None else directory
    return CurveServerKeys(public=public, secret=secret, allowed_clients_dir=allowed)


def load_client_keys(directory: Path | str, name: str, server: str = "broker") -> CurveClientKeys:
    """``name``'s key pair and ``server``'s public key (``server.key``), from ``directory``."""
    directory = Path(directory)
    public, secret = _load_pair(directory, name)
    server_public, _ = zmq.auth.load_certificate(directory / f"{server}.key")
    return CurveClientKeys(public=public, secret=secret, server_public=server_public)


# ---- the allow-list ----------------------------------------------------------------------------


class CurveAuth:
    """The ZAP handler of one zmq context: lets in CURVE clients whose public key is a ``*.key``
    file in ``allowed_clients_dir``. Start it once, before binding; stop it after closing the
    sockets it guards (with no ZAP handler, libzmq lets every CURVE client in)."""

    _running: ClassVar[dict[int, CurveAuth]] = {}  # by libzmq context address

    def __init__(self, ctx: zmq.Context, allowed_clients_dir: Path | str) -> None:
        self.ctx = ctx
        self.allowed_clients_dir = Path(allowed_clients_dir)
        self._auth: ThreadAuthenticator | None = None

    @classmethod
    def running_for(cls, ctx: zmq.Context) -> bool:
        return ctx.underlying in cls._running

    def start(self) -> None:
        if self._auth is not None:
            return
        if self.running_for(self.ctx):
            raise RuntimeError("a CurveAuth already runs for this context (one ZAP handler each)")
        count = self._count_keys()
        auth = ThreadAuthenticator(self.ctx, log=log)
        auth.start()
        auth.configure_curve(domain="*", location=str(self.allowed_clients_dir))
        self._auth = auth
        self._running[self.ctx.underlying] = self
        log.info("CURVE allow-list: %d keys from %s", count, self.allowed_clients_dir)

    def reload(self) -> None:
        """Re-read the allow-list folder (after a key was added or removed)."""
        if self._auth is None:
            raise RuntimeError("CurveAuth is not started")
        count = self._count_keys()
        self._auth.configure_curve(domain="*", location=str(self.allowed_clients_dir))
        log.info("CURVE allow-list: %d keys from %s", count, self.allowed_clients_dir)

    def _count_keys(self) -> int:
        count = len(list(self.allowed_clients_dir.glob("*.key")))
        if not count:
            # zmq.auth would only log this, and then refuse every client.
            raise FileNotFoundError(f"no public *.key files in {self.allowed_clients_dir}")
        return count

    def stop(self) -> None:
        if self._auth is None:
            return
        self._auth.stop()
        self._auth = None
        self._running.pop(self.ctx.underlying, None)

    def __enter__(self) -> CurveAuth:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Refuse a busy port before anything starts, with one line that says which and why."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from launch.children import RoleFailed


def probe(host: str, port: int, what: str, hint: str) -> None:
    """Bind ``host:port`` as a server would (SO_REUSEADDR: TIME_WAIT connections of an earlier
    run do not count; no SO_REUSEPORT: any listener counts); RoleFailed if it cannot."""
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise RoleFailed(f"cannot serve {what} on {host}:{port}: {exc}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise RoleFailed(
                    f"cannot serve {what} on {host}:{port}: {exc.strerror or exc} "
                    f"(is another server using the port? {hint})"
                ) from None


def check_port_free(host: str, port: int) -> None:
    """Refuse a busy HTTP port before starting anything. Ingress processes bound with
    SO_REUSEPORT would otherwise join whatever already listens there (another mesh of the same
    user) and split its traffic instead of failing; a lone ingress would fail only after the
    rest of the mesh came up. A probe without SO_REUSEPORT fails on any listener."""
    if port == 0:
        # Each process would get a port of its own, and we could not find them to probe.
        raise RoleFailed("--http-port 0 cannot work here: the processes share one port; give one")
    probe(host, port, "HTTP", "choose one with --http-port")


def check_endpoint_free(endpoint: str, flag: str) -> None:
    """A ``tcp://HOST:PORT`` endpoint to bind: refuse it when the port is taken. Other
    transports, a wildcard port and an interface name (zmq's, not the resolver's) are left to
    zmq's bind."""
    if not endpoint.startswith("tcp://"):
        return
    parts = urlsplit(endpoint.replace("tcp://*:", "tcp://0.0.0.0:", 1))
    try:
        port = parts.port
    except ValueError:
        return  # "*" or a name: nothing to probe
    if not port or parts.hostname is None:
        return
    try:
        socket.getaddrinfo(parts.hostname, port, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        if parts.hostname != "localhost":
            return
    probe(parts.hostname, port, f"{flag} {endpoint}", f"choose another with {flag}")

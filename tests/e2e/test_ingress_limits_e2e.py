"""The connection limits of a real ``mesh-launch --role ingress`` process, set by its flags:
a slow client's headers time out with 408, connections over the cap get 503 until one closes,
an idle connection is closed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Ingress
from tests.integration.conftest import Mesh

WAIT_S = 20.0


@pytest.fixture(scope="module")
def limited(e2e_mesh: Mesh) -> Iterator[Ingress]:
    ing = Ingress(
        e2e_mesh, "--header-timeout", "1", "--idle-timeout", "3", "--max-connections", "3"
    )
    ing.wait_health()
    yield ing
    assert ing.stop() == 0, e2e_mesh.logs()


def _connect(ing: Ingress) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", ing.port), timeout=WAIT_S)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (a timeout fails the test)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_headers_sent_a_line_a_second_time_out_with_408(limited: Ingress) -> None:
    with _connect(limited) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        sent = 0
        deadline = time.monotonic() + WAIT_S
        closed = False
        while time.monotonic() < deadline and not closed:
            time.sleep(0.5)
            try:
                sock.sendall(b"X-Slow: %d\r\n" % sent)
                sent += 1
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            sock.settimeout(0.01)
            try:
                closed = closed or bool(sock.recv(1, socket.MSG_PEEK))
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
            sock.settimeout(WAIT_S)
        assert closed, "the connection stayed open while its headers trickled in"
        try:
            answer = _read_all(sock)
        except ConnectionResetError:
            answer = b""
        if answer:  # a reset after our last header line may destroy it; it is sent first
            assert answer.startswith(b"HTTP/1.1 408"), answer


def test_connections_over_the_cap_get_503_and_an_idle_one_is_closed(limited: Ingress) -> None:
    held = [_connect(limited) for _ in range(3)]
    try:
        time.sleep(0.5)  # accepted by the server
        with _connect(limited) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = _read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 1" in answer and b"too_many_connections" in answer
        # The idle ones are closed after --idle-timeout, and the cap has room again.
        assert _read_all(held[0]) == b""
    finally:
        for sock in held:
            sock.close()
    with _connect(limited) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")

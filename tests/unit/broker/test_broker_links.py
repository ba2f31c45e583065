"""LinkWatch on real sockets: the routing id of a connection that closes is reported once."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from mesh.broker.links import LinkWatch


@pytest.fixture
def router() -> Iterator[tuple[zmq.Context, zmq.Socket, str]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield ctx, sock, f"tcp://127.0.0.1:{port}"
    sock.close()
    ctx.term()


@pytest.fixture
def watch(router: tuple[zmq.Context, zmq.Socket, str]) -> Iterator[LinkWatch]:
    """A LinkWatch on the router's socket, closed after the test."""
    watching = LinkWatch()
    watching.open(router[1])
    yield watching
    watching.close()


def _hello(ctx: zmq.Context, endpoint: str, router: zmq.Socket) -> tuple[zmq.Socket, list]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send(b"hello")
    assert router.poll(5000)
    return dealer, router.recv_multipart(copy=False)


def _closed(watch: LinkWatch, timeout_s: float = 5) -> list[bytes]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert watch.monitor is not None
        if watch.monitor.poll(100) and (gone := watch.closed()):
            return gone
    return []


def test_a_closed_connection_names_the_peer_that_spoke_over_it(router, watch) -> None:
    ctx, sock, endpoint = router
    kept, (kept_id, _) = _hello(ctx, endpoint, sock)
    dealer, (identity, _) = _hello(ctx, endpoint, sock)
    assert watch.note(kept_id.bytes, kept_id) is None
    assert watch.note(identity.bytes, identity) is None
    dealer.close()
    assert _closed(watch) == [identity.bytes]
    kept.close()
    assert _closed(watch) == [kept_id.bytes]


def test_a_forgotten_peer_is_not_reported(router, watch) -> None:
    ctx, sock, endpoint = router
    dealer, (identity, _) = _hello(ctx, endpoint, sock)
    watch.note(identity.bytes, identity)
    watch.forget(identity.bytes)
    dealer.close()
    assert _closed(watch, timeout_s=1) == []


def test_a_reused_descriptor_reports_its_former_peer() -> None:
    class Frame:
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def get(self, _: int) -> int:
            return self.fd

    watch = LinkWatch()
    watch.monitor = object()  # type: ignore[assignment]  # watching; no socket needed here
    assert watch.note(b"old", Frame(7)) is None  # type: ignore[arg-type]
    assert watch.note(b"old", Frame(7)) is None  # type: ignore[arg-type]  # the same peer again
    assert watch.note(b"new", Frame(7)) == b"old"  # type: ignore[arg-type]


def test_an_unwatched_socket_notes_nothing() -> None:
    assert LinkWatch().note(b"w", object()) is None  # type: ignore[arg-type]

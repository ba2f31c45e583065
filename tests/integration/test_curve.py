"""CurveZMQ over real TCP sockets: only clients on the allow-list get a message through."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from mesh.transport import (
    CurveAuth,
    CurveClientKeys,
    generate_keys,
    load_client_keys,
    load_server_keys,
    secure_bind,
    secure_connect,
)
from proto_msgs import BrokerStats, Ping, Pong, decode, encode

POLL_MS = 500  # a refused client gets nothing; this is how long we wait to be sure
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


@dataclass
class Server:
    ctx: zmq.Context
    sock: zmq.Socket
    monitor: zmq.Socket
    endpoint: str
    keys: Path
    auth: CurveAuth

    def answer_one(self, timeout_ms: int = POLL_MS) -> bool:
        """Answer one Ping with a Pong; False when nothing arrived in time."""
        if not self.sock.poll(timeout_ms):
            return False
        identity, *frames = self.sock.recv_multipart(copy=False)
        ping = decode(frames)
        assert isinstance(ping, Ping)
        self.sock.send_multipart([identity, *encode(Pong(cid=ping.cid, stats=BrokerStats()))])
        return True

    def next_handshake_event(self, timeout_ms: int = 5000) -> int:
        """The next handshake outcome the server saw (success or a failure kind)."""
        wanted = zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED
        while self.monitor.poll(timeout_ms):
            event = recv_monitor_message(self.monitor)["event"]
            if event & wanted:
                return event
        raise AssertionError("no handshake seen by the server")


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:
    keys = generate_keys(tmp_path / "mesh-keys")
    ctx = zmq.Context()
    auth = CurveAuth(ctx, keys)
    auth.start()
    sock = ctx.socket(zmq.ROUTER)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED)
    # ":*" lets the OS pick a free port, with no window for another process to take it.
    endpoint = secure_bind(sock, "tcp://127.0.0.1:*", load_server_keys(keys))
    yield Server(ctx, sock, monitor, endpoint, keys, auth)
    sock.disable_monitor()
    monitor.close()
    sock.close()
    auth.stop()  # after the socket it guards is closed
    ctx.term()


@pytest.fixture
def client_ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()  # another context: as another process would be
    yield ctx
    ctx.destroy(linger=0)


def ping(ctx: zmq.Context, endpoint: str, keys: CurveClientKeys | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    secure_connect(sock, endpoint, keys)
    sock.send_multipart(encode(Ping(cid=42)))
    return sock


def test_allowed_client_talks_to_the_curve_server(server, client_ctx):
    sock = ping(client_ctx, server.endpoint, load_client_keys(server.keys, "worker"))
    assert server.next_handshake_event() == zmq.EVENT_HANDSHAKE_SUCCEEDED
    assert server.answer_one(timeout_ms=5000)
    assert sock.poll(5000)
    pong = decode(sock.recv_multipart())
    assert isinstance(pong, Pong) and pong.cid == 42


def test_client_whose_key_is_not_in_the_allow_list_gets_nothing_through(
    server, client_ctx, tmp_path
):
    stranger_dir = generate_keys(tmp_path / "stranger", names=("worker",))
    (stranger_dir / "broker.key").write_bytes((server.keys / "broker.key").read_bytes())
    stranger = load_client_keys(stranger_dir, "worker")
    sock = ping(client_ctx, server.endpoint, stranger)
    assert server.next_handshake_event() == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert not server.answer_one()
    assert not sock.poll(POLL_MS)


def test_plain_client_gets_nothing_through(server, client_ctx):
    sock = ping(client_ctx, server.endpoint, None)
    assert server.next_handshake_event() & HANDSHAKE_FAILED
    assert not server.answer_one()
    assert not sock.poll(POLL_MS)


def test_client_with_the_wrong_server_key_gets_nothing_through(server, client_ctx, tmp_path):
    impostor = generate_keys(tmp_path / "impostor", names=("broker",))
    keys = load_client_keys(server.keys, "worker")
    keys.server_public = load_server_keys(impostor).public
    sock = ping(client_ctx, server.endpoint, keys)
    assert server.next_handshake_event() & HANDSHAKE_FAILED
    assert not server.answer_one()
    assert not sock.poll(POLL_MS)


def test_a_key_added_to_the_allow_list_is_let_in_after_a_reload(server, client_ctx, tmp_path):
    newcomer_dir = generate_keys(tmp_path / "newcomer", names=("worker-9",))
    (newcomer_dir / "broker.key").write_bytes((server.keys / "broker.key").read_bytes())
    (server.keys / "worker-9.key").write_bytes((newcomer_dir / "worker-9.key").read_bytes())
    server.auth.reload()
    sock = ping(client_ctx, server.endpoint, load_client_keys(newcomer_dir, "worker-9"))
    assert server.answer_one(timeout_ms=5000)
    assert sock.poll(5000)

"""Endpoint classification, the refusal to listen in the clear, socket options and key files."""

from __future__ import annotations

import stat
import time

import numpy as np
import pytest
import zmq

from mesh import transport
from mesh.transport import (
    CurveAuth,
    CurveServerKeys,
    InsecureBindError,
    generate_keys,
    is_loopback,
    load_client_keys,
    load_server_keys,
    secure_bind,
    secure_connect,
    set_common_options,
)


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:5555",
        "tcp://127.8.9.10:5555",
        "tcp://localhost:5555",
        "TCP://LocalHost:5555",
        "tcp://[::1]:5555",
        "tcp://127.0.0.1:*",
        "tcp://[::ffff:127.0.0.1]:5555",
        "tcp://10.0.0.5:7000;127.0.0.1:5555",  # connect from a source address to a loopback peer
        "ipc:///tmp/embedmesh/front",
        "ipc://@abstract-name",
        "inproc://results",
    ],
)
def test_local_endpoints_are_loopback(endpoint):
    assert is_loopback(endpoint)


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://*:5555",
        "tcp://0.0.0.0:5555",
        "tcp://[::]:5555",
        "tcp://[*]:5555",
        "tcp://192.168.1.20:5555",
        "tcp://[2001:db8::1]:5555",
        "tcp://eth0:5555",
        "tcp://broker.internal:5555",
        "tcp://localhost.evil.example:5555",
        "tcp://127.0.0.1.nip.io:5555",
        "tcp://127.0.0.1:7000;10.0.0.5:5555",
        "ws://127.0.0.1:5555",
        "udp://127.0.0.1:5555",
        "127.0.0.1:5555",
        "",
    ],
)
def test_network_endpoints_are_not_loopback(endpoint):
    assert not is_loopback(endpoint)


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.mark.parametrize("endpoint", ["tcp://*:*", "tcp://0.0.0.0:*"])
def test_binding_a_network_endpoint_without_keys_is_refused(ctx, endpoint):
    sock = ctx.socket(zmq.ROUTER)
    with pytest.raises(InsecureBindError, match="--insecure") as info:
        secure_bind(sock, endpoint, None, insecure=False)
    assert "keys" in str(info.value)
    assert sock.getsockopt(zmq.LAST_ENDPOINT) == b""  # nothing was bound


def test_binding_a_network_endpoint_in_the_clear_needs_insecure(ctx, caplog):
    bound = secure_bind(ctx.socket(zmq.ROUTER), "tcp://0.0.0.0:*", None, insecure=True)
    assert bound.startswith("tcp://0.0.0.0:")
    assert "WITHOUT encryption" in caplog.text


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:*", "ipc://{tmp}/sock", "inproc://x"])
def test_binding_loopback_without_keys_is_allowed(ctx, tmp_path, endpoint):
    bound = secure_bind(ctx.socket(zmq.ROUTER), endpoint.format(tmp=tmp_path), None)
    assert bound.split("://")[0] == endpoint.split("://")[0]
    assert not bound.endswith(":*")  # the real port is returned


def test_curve_bind_with_an_allow_list_needs_curve_auth_running(ctx, tmp_path):
    keys = load_server_keys(generate_keys(tmp_path))
    with pytest.raises(RuntimeError, match="CurveAuth"):
        secure_bind(ctx.socket(zmq.ROUTER), "tcp://127.0.0.1:*", keys)
    with CurveAuth(ctx, keys.allowed_clients_dir):
        sock = ctx.socket(zmq.ROUTER)
        secure_bind(sock, "tcp://127.0.0.1:*", keys)
        assert sock.getsockopt(zmq.CURVE_SERVER) == 1
        assert sock.getsockopt(zmq.MECHANISM) == zmq.CURVE
        sock.close()


def test_curve_bind_without_an_allow_list_needs_no_curve_auth(ctx, tmp_path, caplog):
    pair = load_server_keys(generate_keys(tmp_path))
    keys = CurveServerKeys(pair.public, pair.secret, allowed_clients_dir=None)
    secure_bind(ctx.socket(zmq.ROUTER), "tcp://0.0.0.0:*", keys)
    assert "without an allow-list" in caplog.text


def test_common_options_are_bounded_and_fail_fast(ctx):
    sock = ctx.socket(zmq.DEALER)
    set_common_options(sock, "tcp://127.0.0.1:5555")
    assert sock.getsockopt(zmq.LINGER) == 0
    assert sock.getsockopt(zmq.SNDHWM) == transport.SEND_HWM > 1000
    assert sock.getsockopt(zmq.RCVHWM) == transport.RECV_HWM > 1000
    assert sock.getsockopt(zmq.MAXMSGSIZE) > 0
    assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1
    assert sock.getsockopt(zmq.IPV6) == 0


def test_ipv6_is_turned_on_for_an_ipv6_endpoint(ctx):
    sock = ctx.socket(zmq.DEALER)
    secure_connect(sock, "tcp://[::1]:5555", None)
    assert sock.getsockopt(zmq.IPV6) == 1


def test_generated_keys_load_as_server_and_client_pairs(tmp_path):
    key_dir = generate_keys(tmp_path / "keys")
    names = sorted(p.name for p in key_dir.iterdir())
    assert names == [
        f"{n}.key{s}" for n in ("broker", "ingress", "worker") for s in ("", "_secret")
    ]
    for secret in key_dir.glob("*.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    server = load_server_keys(key_dir)
    worker = load_client_keys(key_dir, "worker")
    assert server.allowed_clients_dir == key_dir
    assert worker.server_public == server.public
    assert len({server.public, server.secret, worker.public, worker.secret}) == 4
    assert all(len(k) == 40 for k in (server.public, server.secret, worker.public, worker.secret))


def test_generating_keys_again_keeps_the_existing_ones(tmp_path):
    before = load_server_keys(generate_keys(tmp_path))
    after = load_server_keys(generate_keys(tmp_path, names=("broker", "worker-7")))
    assert after == before
    assert (tmp_path / "worker-7.key").exists()


def test_loading_a_public_key_file_as_a_pair_fails(tmp_path):
    generate_keys(tmp_path)
    (tmp_path / "broker.key_secret").write_bytes((tmp_path / "broker.key").read_bytes())
    with pytest.raises(ValueError, match="no secret key"):
        load_server_keys(tmp_path)


def test_curve_auth_refuses_an_empty_allow_list_and_a_second_handler(ctx, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"\*\.key"):
        CurveAuth(ctx, tmp_path).start()
    assert not CurveAuth.running_for(ctx)
    generate_keys(tmp_path)
    auth = CurveAuth(ctx, tmp_path)
    auth.start()
    auth.start()  # idempotent
    try:
        with pytest.raises(RuntimeError, match="already"):
            CurveAuth(ctx, tmp_path).start()
    finally:
        auth.stop()
    assert not CurveAuth.running_for(ctx)


def _pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    rx = ctx.socket(zmq.PULL)
    rx.bind("inproc://frames")
    tx = ctx.socket(zmq.PUSH)
    tx.connect("inproc://frames")
    return tx, rx


def test_send_frames_puts_the_frames_send_multipart_would_on_the_wire(ctx):
    tx, rx = _pair(ctx)
    frames = [b"id", b"", memoryview(b"body"), np.arange(3, dtype=np.int32), b"x" * 70_000]
    transport.send_frames(tx, frames)
    tx.send_multipart(frames, copy=False)
    mine, theirs = rx.recv_multipart(), rx.recv_multipart()
    assert mine == theirs == [bytes(memoryview(f)) for f in frames]


def test_send_frames_refuses_a_frame_without_a_buffer_before_sending_any(ctx):
    tx, rx = _pair(ctx)
    with pytest.raises(TypeError, match="Frame 1"):
        transport.send_frames(tx, [b"first", "not bytes"])
    transport.send_frames(tx, [b"next"])
    assert rx.recv_multipart() == [b"next"]  # no half message joined to it


def test_send_frames_at_noblock_refuses_at_once_when_no_peer_takes_the_message(ctx):
    tx = ctx.socket(zmq.PUSH)  # no peer: a blocking send would wait
    tx.sndtimeo = 2000  # a send that lost NOBLOCK fails the timing below instead of hanging
    started = time.monotonic()
    with pytest.raises(zmq.Again):
        transport.send_frames(tx, [b"a", b"b"], transport.NOBLOCK)
    assert time.monotonic() - started < 1.0


def test_waiting_reads_each_waiting_message_whole_then_stops(ctx):
    tx, rx = _pair(ctx)
    tx.send_multipart([b"a", b"b", b"c"])
    tx.send_multipart([b"d"])
    while not rx.poll(1000):
        pass
    got = [[f.bytes for f in frames] for frames in transport.waiting(rx)]
    assert got == [[b"a", b"b", b"c"], [b"d"]]
    assert list(transport.waiting(rx)) == []

"""The fault proxy on loopback: each mode does to a TCP echo link what it says."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from bench.faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(60)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fp = FaultProxy(("127.0.0.1", port))
    await fp.start()
    yield fp
    await fp.close()
    server.close()
    await server.wait_closed()


async def _connect(
    proxy: FaultProxy,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    started = time.monotonic()
    writer.write(b"ping")
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
    return time.monotonic() - started


async def test_pass_mode_forwards_bytes_both_ways_unchanged(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    payload = bytes(range(256)) * 4096  # 1 MiB: many chunks, order kept
    writer.write(payload)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(len(payload)), 10) == payload
    writer.close()


async def test_delay_mode_adds_the_delay_each_way(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    await _round_trip(reader, writer)
    proxy.set_mode("delay", delay_ms=100)
    assert await _round_trip(reader, writer) >= 0.2  # 100 ms out, 100 ms back
    proxy.set_mode("pass")
    assert await _round_trip(reader, writer) < 0.2
    writer.close()


async def test_drop_mode_holds_bytes_on_an_open_socket_until_the_link_heals(
    proxy: FaultProxy,
) -> None:
    reader, writer = await _connect(proxy)
    await _round_trip(reader, writer)
    proxy.set_mode("drop")
    writer.write(b"held")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.5)
    assert not reader.at_eof()  # silent: the socket is neither closed nor reset
    proxy.set_mode("pass")
    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"held"
    writer.close()


async def test_blackhole_mode_loses_the_bytes_sent_meanwhile(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.set_mode("blackhole")
    writer.write(b"lost")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.5)
    proxy.set_mode("pass")
    assert await _round_trip(reader, writer) < 5  # the link works again; "lost" never comes
    writer.close()


async def test_reset_mode_resets_open_connections_and_new_ones(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    await _round_trip(reader, writer)
    proxy.set_mode("reset")
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), 5)
    reader2, writer2 = await _connect(proxy)  # the listener still accepts, then resets
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader2.readexactly(1), 5)
    proxy.set_mode("pass")
    reader3, writer3 = await _connect(proxy)
    assert await _round_trip(reader3, writer3) < 5
    for w in (writer, writer2, writer3):
        w.close()


def test_the_proxy_runs_in_a_thread_of_its_own_and_changes_mode_from_another() -> None:
    async def serve() -> None:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with FaultProxy(("127.0.0.1", port)) as fp:
            assert fp.endpoint.startswith("tcp://127.0.0.1:")
            reader, writer = await asyncio.open_connection("127.0.0.1", fp.port)
            fp.set_mode("delay", delay_ms=50)
            await asyncio.sleep(0.05)
            assert await _round_trip(reader, writer) >= 0.1
            writer.close()
        server.close()

    asyncio.run(serve())


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        FaultProxy(("127.0.0.1", 1)).set_mode("flaky")  # type: ignore[arg-type]


async def test_a_connection_made_during_a_partition_reaches_upstream_only_when_it_heals(
    proxy: FaultProxy,
) -> None:
    proxy.set_mode("drop")
    reader, writer = await _connect(proxy)
    writer.write(b"late")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.5)
    proxy.set_mode("pass")
    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"late"
    writer.close()


def test_the_command_line_proxy_switches_mode_by_a_line_on_stdin() -> None:
    import socket
    import subprocess
    import sys

    with socket.create_server(("127.0.0.1", 0)) as upstream:
        port = upstream.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.faultproxy", "--upstream", f"127.0.0.1:{port}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        listening = proc.stdout.readline().split()[-1]
        host, _, proxy_port = listening.rpartition(":")
        for command, answer in (
            ("delay 5", "mode delay 5"),
            ("flaky", None),
            ("pass", "mode pass"),
        ):
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            if answer is not None:
                assert proc.stdout.readline().strip() == answer
        with socket.create_connection((host, int(proxy_port)), timeout=5) as conn:
            conn.sendall(b"through")
            upstream.settimeout(5)
            peer, _ = upstream.accept()
            with peer:
                assert peer.recv(16) == b"through"
        proc.stdin.close()
        assert proc.wait(10) == 0

"""What an ingress allows a TCP connection, on real sockets: a header-read timeout against slow
clients, an idle timeout for kept-alive connections, a cap on open connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from mesh.ingress.config import ConnectionLimits
from mesh.ingress.connections import Guard, GuardedSite, handler_kwargs

HEADER_S = 1.0
IDLE_S = 1.5
CAP = 2
REQUEST = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
WAIT_S = 15.0  # how long a test waits for what must happen within a few seconds


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Both loops: the ingress runs on uvloop, whose transports differ from asyncio's."""
    if request.param == "uvloop":
        import uvloop

        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"bytes": len(await request.read())})


@pytest.fixture
async def site() -> AsyncIterator[tuple[int, Guard]]:
    app = web.Application()
    app.router.add_get("/ok", _ok)
    app.router.add_post("/echo", _echo)
    guard = Guard(ConnectionLimits(HEADER_S, IDLE_S, CAP))
    kwargs = handler_kwargs(guard.limits)
    runner = web.AppRunner(app, handler_cancellation=True, **kwargs)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, guard, kwargs)
    await site.start()
    try:
        yield site.port, guard
    finally:
        await runner.cleanup()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _response(reader: asyncio.StreamReader) -> bytes:
    """One response's head and body (Content-Length framed)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await asyncio.wait_for(reader.readexactly(length), WAIT_S)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection within WAIT_S (what it sent is dropped)."""
    try:
        async with asyncio.timeout(WAIT_S):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed (or reset) the connection."""
    data = b""
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except ConnectionError:
        pass
    return data


async def test_a_client_trickling_header_lines_gets_408_and_is_closed(
    site: tuple[int, Guard],
) -> None:
    port, guard = site
    reader, writer = await _connect(port)
    # Read all along: the 408 arrives before the close, ahead of our next line.
    answer = asyncio.create_task(_read_until_closed(reader))
    writer.write(b"GET /ok HTTP/1.1\r\n")
    lines = int(WAIT_S / 0.25)
    sent = 1
    # One header line every 0.25 s, for far longer than the header timeout if it let us.
    while sent < lines and not answer.done():
        await asyncio.sleep(0.25)
        try:
            writer.write(b"X-Slow: %d\r\n" % sent)
            await writer.drain()
        except ConnectionError:
            break
        sent += 1
    got = await asyncio.wait_for(answer, WAIT_S)
    assert got.startswith(b"HTTP/1.1 408"), got
    assert b"request_timeout" in got
    assert sent < lines, "the headers never completed, yet the connection stayed"
    assert guard.header_timeouts == 1
    writer.close()


async def test_a_whole_request_sent_slowly_within_the_timeout_is_served(
    site: tuple[int, Guard],
) -> None:
    port, _ = site
    reader, writer = await _connect(port)
    for line in REQUEST.split(b"\r\n")[:-1]:
        writer.write(line + b"\r\n")
        await asyncio.sleep(HEADER_S / 10)
    assert (await _response(reader)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_body_sent_in_pieces_leaves_no_header_timer_on_its_kept_alive_connection(
    site: tuple[int, Guard],
) -> None:
    port, guard = site
    reader, writer = await _connect(port)
    body = b"x" * 300_000
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    for i in range(0, len(body), 50_000):  # the body in pieces, the first with the headers
        writer.write(body[i : i + 50_000])
        await writer.drain()
    assert (await _response(reader)).endswith(b'{"bytes": 300000}')
    # Idle past the header timeout, within the idle one: still open, and it serves.
    await asyncio.sleep(HEADER_S + (IDLE_S - HEADER_S) / 2)
    writer.write(REQUEST)
    assert (await _response(reader)).startswith(b"HTTP/1.1 200")
    assert guard.header_timeouts == 0
    writer.close()


async def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(
    site: tuple[int, Guard],
) -> None:
    port, guard = site
    reader, writer = await _connect(port)
    writer.write(REQUEST)
    assert (await _response(reader)).startswith(b"HTTP/1.1 200")
    assert guard.open == 1
    assert await _closed(reader), "an idle kept-alive connection stayed open"
    await asyncio.sleep(0.1)
    assert guard.open == 0
    writer.close()


async def test_connections_over_the_cap_get_503_until_one_closes(
    site: tuple[int, Guard],
) -> None:
    port, guard = site
    held = [await _connect(port) for _ in range(CAP)]
    while guard.open < CAP:
        await asyncio.sleep(0.01)
    reader, writer = await _connect(port)
    writer.write(REQUEST)
    refusal = await _response(reader)
    assert refusal.startswith(b"HTTP/1.1 503"), refusal
    assert b"Retry-After: 1" in refusal and b"Connection: close" in refusal
    assert b"too_many_connections" in refusal
    assert await _closed(reader)
    writer.close()
    assert guard.refused == 1
    # The held ones are served as ever.
    held[0][1].write(REQUEST)
    assert (await _response(held[0][0])).startswith(b"HTTP/1.1 200")
    held[1][1].close()
    while guard.open >= CAP:
        await asyncio.sleep(0.01)
    reader, writer = await _connect(port)
    writer.write(REQUEST)
    assert (await _response(reader)).startswith(b"HTTP/1.1 200")
    writer.close()
    held[0][1].close()

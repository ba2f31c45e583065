"""Stopping a mesh under load: SIGTERM drains, a stalled body times out. Real processes."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.spawn import free_port
from tests.integration.launched import (
    START_S,
    Load,
    base_url,
    descendants,
    start,
    wait_gone,
)

GRACE_S = 120  # far more than the test's requests need: the drain, not the grace, ends them
HEAVY = 800  # inputs: a request that takes longer than the old fixed 5 s stop of a stage


def test_sigterm_under_load_finishes_every_accepted_request_refuses_the_rest_and_exits_0(
    tmp_path: Path,
) -> None:
    run = start(tmp_path, "--http-port", str(free_port()), "--drain-grace", str(GRACE_S))
    try:
        base = base_url(run.first_line(START_S))
        # Three light clients and a heavy one, signalled just after a heavy request started.
        with Load(base, [4, 4, 4, HEAVY], until_refused=True) as load:
            load.wait_for(5)
            first = load.sending.get(3, 0.0)
            while load.sending.get(3, 0.0) == first:
                time.sleep(0.01)
            time.sleep(0.2)
            signalled = time.monotonic()
            run.proc.send_signal(signal.SIGTERM)
            code = run.proc.wait(timeout=GRACE_S + 60)
            outcomes = load.stop()
    finally:
        run.kill()
    err = run.stderr.read_text()
    assert code == 0, err[-3000:]
    assert "killing it" not in err, err[-3000:]
    summary = load.summary()
    errors = load.errors()
    stopped_s = max(o.ended for o in outcomes) - signalled
    print(f"\nSIGTERM under load: {summary}; "
          f"{len([o for o in outcomes if o.started < signalled < o.ended])} in flight at the "
          f"signal; the last answer {stopped_s:.1f}s after it")  # fmt: skip
    assert not errors, f"{len(errors)} dropped or failed ({summary}): {errors[:5]}"
    in_flight = [o for o in outcomes if o.started < signalled < o.ended]
    assert in_flight, f"nothing was in flight at SIGTERM; the test proves nothing ({summary})"
    assert all(o.kind == "ok" for o in in_flight), in_flight
    assert any(o.client == 3 for o in in_flight), f"the heavy request was not in flight: {summary}"
    # Every client ended on a clean refusal: the server was gone, and said so.
    assert load.count("refused") >= len(load.texts), summary
    assert "ingress draining" in err and "ingress stopped" in err


def test_a_second_sigterm_stops_at_once_without_waiting_for_the_drain(tmp_path: Path) -> None:
    run = start(tmp_path, "--http-port", str(free_port()), "--drain-grace", str(GRACE_S))
    try:
        base = base_url(run.first_line(START_S))
        children = descendants(run.proc.pid)
        with Load(base, [HEAVY]) as load:
            while not load.sending:  # a heavy request is on its way
                time.sleep(0.01)
            time.sleep(0.5)
            run.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the ingress drains: the heavy request is still running
            run.proc.send_signal(signal.SIGTERM)
            code = run.proc.wait(timeout=GRACE_S / 2)  # well before the heavy request is done
            load.stop()
    finally:
        run.kill()
    err = run.stderr.read_text()
    assert code == 0, err[-3000:]
    assert "a second Ctrl-C or SIGTERM stops at once" in err
    assert "embedmesh: ingress: a second signal; killing it" in err, err[-3000:]
    assert not wait_gone(children), "children outlived the supervisor"


async def test_a_draining_ingress_refuses_late_work_and_finishes_accepted_work() -> None:
    """The drain itself, in process on real sockets, step by step: new connections refused,
    a late request on a kept-alive connection 503 with Connection: close, the accepted one
    finished (also with Connection: close) before the drain ends."""
    import aiohttp
    from aiohttp import web

    from mesh.ingress.server import Gate, _drain

    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await request.read()
        await release.wait()
        return web.json_response({"done": True})

    async def fast(request: web.Request) -> web.Response:
        return web.json_response({"done": True})

    gate = Gate(body_timeout_s=30)
    app = web.Application(middlewares=[gate.middleware])
    app.router.add_post("/slow", slow)
    app.router.add_get("/fast", fast)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"

    def one_connection() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))

    try:
        async with one_connection() as busy, one_connection() as idle:
            async with idle.get(f"{url}/fast") as resp:  # idle now holds a kept-alive connection
                assert resp.status == 200 and resp.headers.get("Connection") != "close"
            accepted = asyncio.create_task(busy.post(f"{url}/slow", data=b"body"))
            while gate.in_flight == 0:
                await asyncio.sleep(0.01)
            drain = asyncio.create_task(_drain(runner, gate, grace_s=60))
            while not gate.draining:
                await asyncio.sleep(0.01)
            async with one_connection() as fresh:
                with pytest.raises(aiohttp.ClientConnectorError):  # the listener is closed
                    await fresh.get(f"{url}/fast")
            async with idle.get(f"{url}/fast") as resp:  # late, on an open connection
                assert resp.status == 503 and resp.headers["Connection"] == "close"
                assert (await resp.json())["error"]["code"] == "unavailable"
            await asyncio.sleep(0.5)
            assert not drain.done(), "the drain ended with a request still in flight"
            release.set()
            resp = await accepted
            assert resp.status == 200 and resp.headers["Connection"] == "close"
            assert await resp.json() == {"done": True}
            await asyncio.wait_for(drain, 30)
    finally:
        await runner.cleanup()


def _wait_listening(base: str, timeout_s: float = START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # an answer (503 without a broker) means it listens
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the ingress at {base} did not answer within {timeout_s}s")


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_body_that_never_arrives_gets_408_and_its_connection_is_closed(tmp_path: Path) -> None:
    port = free_port()
    # An ingress alone: the body timeout is the HTTP edge's, no broker needed.
    run = start(
        tmp_path,
        "--http-port", str(port), "--broker", f"ipc://{tmp_path}/no-broker",
        "--body-timeout", "1", "--ingress-procs", "1",
        role="ingress",
    )  # fmt: skip
    try:
        _wait_listening(f"http://127.0.0.1:{port}")
        stalled = []
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"input": '
            )
            stalled.append(sock)
        answers = [_read_all(sock) for sock in stalled]  # returns: the server closed each
        for sock in stalled:
            sock.close()
        assert run.proc.poll() is None, run.stderr.read_text()[-3000:]
    finally:
        run.proc.send_signal(signal.SIGTERM)
        code = run.proc.wait(timeout=60)
        run.kill()
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"connection: close" in head.lower(), head
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout" and "1s" in error["message"], error
    assert code == 0

"""The drain's gate: late work refused with 503, liveness still answered; the body timeout."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from mesh.ingress.app import LIVENESS_PATH
from mesh.ingress.files import UPLOAD_PATH
from mesh.ingress.server import Gate


async def _ok(_: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


async def test_a_draining_gate_refuses_work_but_answers_liveness() -> None:
    gate = Gate(body_timeout_s=1.0)
    gate.draining = True
    live = await gate.middleware(make_mocked_request("GET", LIVENESS_PATH), _ok)
    assert live.status == 200
    late = await gate.middleware(make_mocked_request("GET", "/health/ready"), _ok)
    assert late.status == 503


async def _read_body(request: web.Request) -> web.StreamResponse:
    return web.json_response({"bytes": len(await request.read())})


async def _post_slowly(client, path: str, pieces: int, gap_s: float, size: int = 8192):  # noqa: ANN001, ANN202
    async def body():  # noqa: ANN202
        for i in range(pieces):
            if i:
                await asyncio.sleep(gap_s)
            yield b"x" * size

    return await client.post(path, data=body())


async def test_an_upload_may_take_longer_than_the_body_timeout_while_it_keeps_arriving() -> None:
    gate = Gate(body_timeout_s=0.5)
    app = web.Application(middlewares=[gate.middleware])
    app.router.add_post(UPLOAD_PATH, _read_body)
    app.router.add_post("/v1/embeddings", _read_body)
    async with TestClient(TestServer(app)) as client:
        # 1.6 s in all, 8 KiB every 0.2 s (40 KiB/s): an upload goes through, another body
        # does not.
        upload = await _post_slowly(client, UPLOAD_PATH, 9, 0.2)
        assert upload.status == 200 and (await upload.json())["bytes"] == 9 * 8192
        other = await _post_slowly(client, "/v1/embeddings", 9, 0.2)
        assert other.status == 408
        assert "within 0.5s of its headers" in (await other.json())["error"]["message"]
        # An upload that stops arriving, or trickles (100 bytes every 0.2 s: 0.5 KiB/s, under
        # UPLOAD_MIN_RATE), still ends in 408.
        for pieces, gap_s, size in ((3, 1.5, 8192), (20, 0.2, 100)):
            slow = await _post_slowly(client, UPLOAD_PATH, pieces, gap_s, size)
            assert slow.status == 408
            assert (
                "arrived slower than 16 KiB/s over 0.5s" in (await slow.json())["error"]["message"]
            )


async def test_an_upload_the_server_is_slow_to_read_is_not_cut_off() -> None:
    # The handler reads nothing for 1.5 s (its upload thread busy elsewhere): the client sent
    # everything meanwhile; waiting on the server is not the client's stall.
    async def late_reader(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1.5)
        size = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            size += len(chunk)
        return web.json_response({"bytes": size})

    gate = Gate(body_timeout_s=0.5)
    app = web.Application(middlewares=[gate.middleware])
    app.router.add_post(UPLOAD_PATH, late_reader)
    async with TestClient(TestServer(app)) as client:
        resp = await _post_slowly(client, UPLOAD_PATH, 64, 0.0, 1 << 20)  # 64 MiB, fast
        assert resp.status == 200 and (await resp.json())["bytes"] == 64 << 20

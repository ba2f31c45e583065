"""The drain's gate: late work refused with 503, liveness still answered."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from mesh.ingress.app import LIVENESS_PATH
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

"""The HTTP stack's own share of an idle query: ``--mode hops``'s way ``http_floor``.

A bare aiohttp server on uvloop, as the ingress serves (no access log), with no middleware and
no mesh behind it, answers ``POST /v1/embeddings`` with a canned body: the response the mesh
gave the same query, so the bytes on the wire are the same. ``hops`` times it with the same
client as its ``http`` way. What is left between the two is the ingress and the mesh; what
the floor costs no work inside the mesh can remove (the load client, the loopback socket, the
server's request and response handling).

    python -m bench.http_floor --port P --body FILE    # serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench.spawn import free_port

READY_WAIT_S = 30.0


def app_answering(body: bytes) -> web.Application:
    async def embeddings(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    return app


async def serve(body: bytes, port: int) -> None:
    runner = web.AppRunner(app_answering(body), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    await asyncio.Event().wait()  # until killed


class FloorServer:
    """``python -m bench.http_floor`` in a process of its own (the ingress's is one too),
    answering ``body``; ``url`` once entered."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> FloorServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="embedmesh-floor-")
        path = Path(self._tmp.name) / "body.json"
        path.write_bytes(self.body)
        port = free_port()
        cmd = [sys.executable, "-m", "bench.http_floor", "--port", str(port), "--body", str(path)]
        self._proc = subprocess.Popen(cmd)
        try:
            _wait_listening(port, self._proc)
        except BaseException:
            self.__exit__()
            raise
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the floor server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the floor server did not listen on port {port} in {READY_WAIT_S:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A bare aiohttp server answering one body.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", type=Path, required=True, help="file holding the response")
    args = parser.parse_args(argv)
    body = args.body.read_bytes()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(body, args.port))
    else:
        uvloop.run(serve(body, args.port))


if __name__ == "__main__":
    main()

"""``mesh-embed``'s test helpers: a fake OpenAI-compatible ``/v1/embeddings`` server, input
files written and outputs read back in every format, and the command as a process.

The server runs in a thread of the test process on a free loopback port and answers fast, with
deterministic vectors (``fake_vectors``), so a test can check a whole output without a model.
``script`` gives the answers to the first requests (a 429 with ``Retry-After``, a 503, a 400;
``None`` for a normal answer), normal answers following; ``delay_s`` slows each answer, so a
client can be interrupted mid-run.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from aiohttp import web

from bench.spawn import free_port

DIMS = 384


def fake_vectors(texts: list[str], dims: int = DIMS) -> np.ndarray:
    """A distinct, reproducible float32 row per text."""
    seeds = np.array([zlib.crc32(t.encode()) % 9973 for t in texts], dtype=np.float32)
    return seeds[:, None] + np.arange(dims, dtype=np.float32)[None, :] / 1024


def fake_tokens(texts: list[str]) -> int:
    return sum(len(t.split()) + 2 for t in texts)


@dataclass
class Scripted:
    """One answer sent instead of the normal one."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "scripted"


@dataclass
class FakeServer:
    dims: int = DIMS
    script: list[Scripted | None] = field(default_factory=list)
    delay_s: float = 0.0
    api_key: str | None = None
    port: int = field(default_factory=free_port)
    requests: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, status)
    served: int = 0  # texts embedded
    priorities: set[str | None] = field(default_factory=set)  # X-Embedmesh-Priority values seen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _embeddings(self, request: web.Request) -> web.Response:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._answer(401, {}, "wrong API key")
        body = await request.json()
        self.priorities.add(request.headers.get("X-Embedmesh-Priority"))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        step = self.script.pop(0) if self.script else None
        if step is not None:
            return self._answer(step.status, step.headers, step.message)
        texts = body["input"]
        vectors = fake_vectors(texts, body.get("dimensions") or self.dims)
        as_base64 = body.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if as_base64 else v.tolist()}
                for i, v in enumerate(vectors)]  # fmt: skip
        data.reverse()  # clients must place each vector by its index
        self.requests.append((time.monotonic(), 200))
        self.served += len(texts)
        tokens = fake_tokens(texts)
        return web.json_response({"object": "list", "data": data, "model": body["model"],
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})  # fmt: skip

    def _answer(self, status: int, headers: dict[str, str], message: str) -> web.Response:
        self.requests.append((time.monotonic(), status))
        error = {"error": {"message": message, "type": "error", "code": status}}
        return web.json_response(error, status=status, headers=headers)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self._embeddings)

    def serve(self) -> Iterator[FakeServer]:
        """Serves in a thread until the generator is closed (a fixture's body)."""
        loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=64 * 2**20)
        self.routes(app)
        runner = web.AppRunner(app)

        async def start() -> None:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()

        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def mesh_embed_command() -> list[str]:
    """``mesh-embed`` as a process of this interpreter (importing this checkout's code)."""
    return [sys.executable, "-m", "mesh.embed_cli"]


def write_input(path: Path, texts: list[str]) -> Path:
    """``texts`` as a .jsonl, .csv or .parquet file (by ``path``'s suffix), the ids ``doc-N``."""
    ids = [f"doc-{i}" for i in range(len(texts))]
    if path.suffix == ".jsonl":
        with path.open("wb") as f:
            for id_, text in zip(ids, texts, strict=True):
                f.write(orjson.dumps({"id": id_, "text": text}) + b"\n")
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([("id", "text"), *zip(ids, texts, strict=True)])
    else:
        pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=64)
    return path


def read_output(path: Path) -> tuple[list[Any] | None, np.ndarray]:
    """(the ids, or None for .npy; the vectors) of a mesh-embed output."""
    if path.suffix == ".npy":
        return None, np.load(path)
    if path.suffix == ".jsonl":
        docs = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        return [d["id"] for d in docs], np.array([d["embedding"] for d in docs], np.float32)
    table = pq.read_table(path)
    return table["id"].to_pylist(), np.array(table["embedding"].to_pylist(), np.float32)


def peak_rss_mib(argv: list[str]) -> float:
    """mesh-embed's peak resident memory over a run, as the process itself measured it."""
    probe = ("import resource, sys\nfrom mesh.embed_cli.cli import main\ntry:\n    main()\n"
             "finally:\n    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "    print(f'peak_rss_kib {peak}', file=sys.stderr)\n")  # fmt: skip
    done = subprocess.run([*mesh_embed_command()[:1], "-c", probe, *argv], stderr=subprocess.PIPE,
                          text=True, timeout=240, env={**os.environ})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stderr.strip().splitlines()[-1].split()[1]) / 1024

"""A fake OpenAI Files and Batches API beside the fake ``/v1/embeddings`` (``FakeServer``), for
``mesh-embed --batch``'s tests without a mesh.

Files are kept on disk (a temporary directory), so a test can push a large file through without
the test process holding it. A batch runs in the server's loop, ``line_delay_s`` a line, its ``request_counts`` and
``tokens_done`` moving as it goes; its output file lists the lines in reverse (OpenAI promises
no order, so clients must not rely on one); a line with a text that starts with ``BAD`` fails with
a 400 into the error file, as embedmesh fails a line too long for the model.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tests.fake_embeddings import FakeServer, fake_tokens, fake_vectors

_ids = itertools.count(1)


@dataclass
class FakeBatchServer(FakeServer):
    line_delay_s: float = 0.0
    files: dict[str, Path] = field(default_factory=dict)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fake-batches-")))
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    lines_run: int = 0  # batch lines answered, all batches together

    def _file(self, lines: list[bytes] | None = None) -> tuple[str, Path]:
        file_id = f"file-{next(_ids)}"
        self.files[file_id] = path = self.root / file_id
        path.write_bytes(b"".join(line + b"\n" for line in lines or []))
        return file_id, path

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("purpose") != "batch":
            return self._answer(400, {}, "purpose must be batch")
        upload = form["file"]
        file_id, path = self._file()
        with path.open("wb") as out:
            shutil.copyfileobj(upload.file, out)  # type: ignore[union-attr]
        return web.json_response({"id": file_id, "object": "file", "purpose": "batch"})

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("input_file_id") not in self.files or body["endpoint"] != "/v1/embeddings":
            return self._answer(400, {}, "no such file or endpoint")
        lines = self.files[body["input_file_id"]].read_bytes().splitlines()
        batch = {"id": f"batch_{next(_ids)}", "object": "batch", "status": "in_progress",
                 "input_file_id": body["input_file_id"], "output_file_id": None,
                 "error_file_id": None, "errors": None, "metadata": body.get("metadata"),
                 "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                 "tokens_done": 0, "tokens_total": 0}  # fmt: skip
        self.batches[batch["id"]] = batch
        asyncio.get_running_loop().create_task(self._run(batch, lines))
        return web.json_response(batch)

    async def _run(self, batch: dict[str, Any], lines: list[bytes]) -> None:
        """Answers each line; the output file holds the odd lines, then the even ones (an
        order of the server's own), written as they go."""
        (odd_id, odd), (even_id, even), (error_id, error) = self._file(), self._file(), self._file()
        counts = batch["request_counts"]
        with odd.open("ab") as odd_f, even.open("ab") as even_f, error.open("ab") as error_f:
            for n, raw in enumerate(lines):
                if batch["status"] != "in_progress":
                    break
                await asyncio.sleep(self.line_delay_s)  # 0: lets the polls in between lines
                line = orjson.loads(raw)
                answer = self._line(line)
                ok = answer["error"] is None
                (error_f if not ok else odd_f if n % 2 else even_f).write(
                    orjson.dumps(answer) + b"\n"
                )
                counts["completed" if ok else "failed"] += 1
                texts = line["body"]["input"]
                batch["tokens_done"] += fake_tokens(texts if isinstance(texts, list) else [texts])
                self.lines_run += 1
        with odd.open("ab") as odd_f, even.open("rb") as even_f:
            shutil.copyfileobj(even_f, odd_f)
        even.unlink()
        del self.files[even_id]
        batch["output_file_id"] = odd_id if odd.stat().st_size else None
        batch["error_file_id"] = error_id if error.stat().st_size else None
        batch["status"] = "completed" if batch["status"] == "in_progress" else "cancelled"

    def _line(self, line: dict[str, Any]) -> dict[str, Any]:
        body = line["body"]
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        answer = {"id": f"batch_req_{next(_ids)}", "custom_id": line["custom_id"], "error": None}
        if bad := [t for t in texts if t.startswith("BAD")]:
            error = {"message": f"text {bad[0]!r} refused", "type": "invalid_request_error"}
            answer["response"] = {"status_code": 400, "request_id": "r", "body": {"error": error}}
            answer["error"] = {"code": "invalid_request", "message": error["message"]}
            return answer
        vectors = fake_vectors(texts, body.get("dimensions") or self.dims)
        as_base64 = body.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if as_base64 else v.tolist()}
                for i, v in enumerate(vectors)]  # fmt: skip
        data.reverse()  # clients must place each vector by its index
        tokens = fake_tokens(texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        answer["response"] = {"status_code": 200, "request_id": "r",
                              "body": {"object": "list", "data": data, "usage": usage}}  # fmt: skip
        return answer

    async def _retrieve(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        return web.json_response(batch) if batch else self._answer(404, {}, "no such batch")

    async def _cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return self._answer(404, {}, "no such batch")
        if batch["status"] == "in_progress":
            batch["status"] = "cancelling"
        return web.json_response(batch)

    async def _content(self, request: web.Request) -> web.StreamResponse:
        path = self.files.get(request.match_info["id"])
        if path is None:
            return self._answer(404, {}, "no such file")
        return web.FileResponse(path)

    async def _delete(self, request: web.Request) -> web.Response:
        file_id = request.match_info["id"]
        path = self.files.pop(file_id, None)
        if path is None:
            return self._answer(404, {}, "no such file")
        path.unlink()
        self.deleted.append(file_id)
        return web.json_response({"id": file_id, "object": "file", "deleted": True})

    def routes(self, app: web.Application) -> None:
        super().routes(app)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_delete("/v1/files/{id}", self._delete)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches/{id}", self._retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", self._cancel)

    def running(self) -> list[dict[str, Any]]:
        return [b for b in self.batches.values() if b["status"] in ("in_progress", "cancelling")]

    def wait_idle(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while self.running():
            assert time.monotonic() < deadline, "batches still running"
            time.sleep(0.02)


def serve_batches(**options: Any) -> Iterator[FakeBatchServer]:
    """A fixture's body: the server, its files removed at the end."""
    server = FakeBatchServer(**options)
    try:
        yield from server.serve()
    finally:
        shutil.rmtree(server.root, ignore_errors=True)

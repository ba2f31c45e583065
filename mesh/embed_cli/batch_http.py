"""OpenAI's Files and Batches API, the calls ``--batch`` makes: upload, create, retrieve,
cancel, download, delete.

aiohttp rather than the ``openai`` client: the same session, headers and retry rules as the
direct mode (``client``: 408, 409, 429, 5xx and failed connections retried with backoff or
after ``Retry-After``), the upload streamed from disk and the download streamed to disk in
chunks, so neither holds a file in memory; and no second HTTP stack to import.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from mesh.embed_cli.client import (
    MAX_RETRY_AFTER_S,
    PRIORITY_HEADER,
    RETRIED,
    backoff_s,
    error_message,
    retry_after_s,
)
from mesh.embed_cli.errors import ServerRefused, ServerUnavailable

CHUNK_BYTES = 1 << 20


class Retry(Exception):
    """A response or failure worth another try; ``wait`` is what the server asked for."""

    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait


class BatchApi:
    """One session against ``url`` (the server's ``/v1`` base)."""

    def __init__(self, url: str, *, api_key: str | None = None, max_retries: int = 8,
                 timeout_s: float = 600, priority: str = "batch") -> None:  # fmt: skip
        self.base = url.rstrip("/")
        self.max_retries = max_retries
        self.headers = {PRIORITY_HEADER: priority}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> BatchApi:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self.headers)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def upload(self, path: Path) -> str:
        """``POST /files`` (purpose ``batch``), the file streamed from disk: its id."""

        @contextlib.contextmanager
        def form() -> Iterator[aiohttp.FormData]:
            with path.open("rb") as f:  # opened again by each try, closed after it
                data = aiohttp.FormData()
                data.add_field("purpose", "batch")
                data.add_field("file", f, filename=path.name, content_type="application/jsonl")
                yield data

        doc = await self._json("POST", "/files", form=form)
        return str(doc["id"])

    async def create(self, input_file_id: str, window: str, metadata: dict[str, str]) -> dict[str, Any]:  # fmt: skip
        body = {"input_file_id": input_file_id, "endpoint": "/v1/embeddings",
                "completion_window": window, "metadata": metadata}  # fmt: skip
        return await self._json("POST", "/batches", json=body)

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/batches/{batch_id}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self._json("POST", f"/batches/{batch_id}/cancel")

    async def delete_file(self, file_id: str) -> None:
        await self._json("DELETE", f"/files/{file_id}")

    async def download(self, file_id: str, dest: Path) -> int:
        """``GET /files/{id}/content`` written to ``dest`` a chunk at a time: its bytes."""

        async def attempt() -> int:
            async with self._send("GET", f"/files/{file_id}/content") as resp:
                await self._check(resp)
                written = 0
                with dest.open("wb") as out:
                    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                        out.write(chunk)
                        written += len(chunk)
                return written

        return await self._retried(f"GET {self.base}/files/{file_id}/content", attempt)

    def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self._session is not None, "use BatchApi as an async context manager"
        return self._session.request(method, self.base + path, **kwargs)

    async def _check(self, resp: aiohttp.ClientResponse) -> None:
        """Raises for anything but a 2xx: ``Retry`` where retrying may help."""
        if resp.status < 300:
            return
        message = error_message(resp.status, await resp.read())
        if resp.status == 404 and resp.method == "POST":
            message += " (is --url the server's /v1 base, and does it serve the Batch API?)"
        if resp.status in RETRIED or resp.status >= 500:
            wait = retry_after_s(resp.headers)
            raise Retry(message, None if wait is None else min(wait, MAX_RETRY_AFTER_S))
        raise ServerRefused(f"{resp.method} {resp.url}: {message}")

    async def _json(self, method: str, path: str, *,
                    form: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                    json: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        async def attempt() -> dict[str, Any]:
            with form() if form is not None else contextlib.nullcontext() as data:
                kwargs: dict[str, Any] = {"data": data} if data is not None else {}
                if json is not None:
                    kwargs = {"data": orjson.dumps(json),
                              "headers": {"Content-Type": "application/json"}}  # fmt: skip
                async with self._send(method, path, **kwargs) as resp:
                    await self._check(resp)
                    raw = await resp.read()
            try:
                doc = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                raise ServerRefused(f"{method} {self.base}{path}: a 2xx without JSON") from None
            if not isinstance(doc, dict):
                raise ServerRefused(f"{method} {self.base}{path}: a 2xx without a JSON object")
            return doc

        return await self._retried(f"{method} {self.base}{path}", attempt)

    async def _retried(self, what: str, attempt: Callable[[], Any]) -> Any:
        for tried in range(self.max_retries + 1):
            try:
                return await attempt()
            except Retry as exc:
                failure, wait = str(exc), exc.wait
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                failure, wait = f"{what}: {exc.__class__.__name__}: {exc}", None
            if tried == self.max_retries:
                raise ServerUnavailable(f"{failure} (after {self.max_retries} retries)")
            await asyncio.sleep(backoff_s(tried) if wait is None else wait)
        raise AssertionError("unreachable")

"""``POST {url}/embeddings`` with retries: what any OpenAI-compatible server speaks.

Every request carries ``X-Embedmesh-Priority`` (``batch`` by default), so that on embedmesh a
file's requests take the batch lane, behind live queries, whatever their size; other servers
ignore the header.

Retried, with exponential backoff and jitter, as the ``openai`` client does: 408, 409, 429 and
5xx answers and failed connections; a ``Retry-After`` (seconds or an HTTP date) or
``retry-after-ms`` header sets the wait instead. Any other 4xx fails at once with the
server's message.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson
import pybase64

from mesh.embed_cli.errors import ServerRefused, ServerUnavailable

PRIORITY_HEADER = "X-Embedmesh-Priority"  # mesh/ingress/schema.py reads it
RETRIED = {408, 409, 429}
BACKOFF_S = (0.5, 8.0)  # first wait, longest wait
MAX_RETRY_AFTER_S = 60.0  # a server asking for longer is waited on only this long per try


@dataclass
class Embedded:
    """One batch's vectors (in input order) and the tokens the server counted."""

    vectors: np.ndarray
    tokens: int


def retry_after_s(headers: Any, now: float | None = None) -> float | None:
    """The wait a response asks for, in seconds; None when it names none."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_s(attempt: int) -> float:
    """The wait before retry ``attempt`` (0-based) when the server names none."""
    first, longest = BACKOFF_S
    return min(longest, first * 2**attempt) * random.uniform(0.75, 1.0)


def decode(body: dict[str, Any], count: int, dims: int | None) -> np.ndarray:
    """The ``data`` of a response as a (count, dims) float32 matrix, by each item's index."""
    data = body.get("data")
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise ServerRefused(f"the server answered {got} embeddings for {count} inputs")
    rows: list[np.ndarray | None] = [None] * count
    for position, item in enumerate(data):
        vector = item["embedding"]
        if isinstance(vector, str):
            row = np.frombuffer(pybase64.b64decode(vector, validate=True), dtype="<f4")
        else:
            row = np.asarray(vector, dtype=np.float32)
        # Checked, not trusted: 5 of 2 would escape as an IndexError, -1 would land on the last.
        index = int(item.get("index", position))
        if not 0 <= index < count or rows[index] is not None:
            raise ServerRefused(
                f"the server answered index {index} twice or outside 0..{count - 1}"
            )
        rows[index] = row
    widths = {len(r) for r in rows if r is not None}
    if len(widths) != 1 or (dims is not None and widths != {dims}):
        raise ServerRefused(f"the server answered vectors of widths {sorted(widths)}")
    return np.stack(rows)  # type: ignore[arg-type]  # each index once: none is None


def error_message(status: int, raw: bytes) -> str:
    """The server's own message: OpenAI's ``error.message``, TEI's ``error``, or the text."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return f"HTTP {status}: {raw[:500].decode(errors='replace').strip()}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return f"HTTP {status}: {error['message']}"
    if isinstance(error, str):
        return f"HTTP {status}: {error}"
    return f"HTTP {status}: {raw[:500].decode(errors='replace')}"


class EmbeddingsClient:
    """One HTTP session; ``embed`` is safe to call from many tasks at once."""

    def __init__(self, url: str, model: str, *, api_key: str | None = None,
                 dimensions: int | None = None, encoding_format: str = "base64",
                 max_retries: int = 8, timeout_s: float = 600, connections: int = 8,
                 priority: str = "batch") -> None:  # fmt: skip
        self.endpoint = url.rstrip("/") + "/embeddings"
        self.model, self.dimensions, self.encoding_format = model, dimensions, encoding_format
        self.max_retries = max_retries
        self.headers = {PRIORITY_HEADER: priority}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EmbeddingsClient:
        connector = aiohttp.TCPConnector(limit=self._connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                              headers=self.headers)  # fmt: skip
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    def _body(self, texts: list[str]) -> bytes:
        body: dict[str, Any] = {"model": self.model, "input": texts,
                                "encoding_format": self.encoding_format}  # fmt: skip
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        return orjson.dumps(body)

    async def embed(self, texts: list[str]) -> Embedded:
        payload = self._body(texts)
        for attempt in range(self.max_retries + 1):
            wait, failure = await self._try(payload, len(texts))
            if isinstance(failure, Embedded):
                return failure
            if attempt == self.max_retries:
                raise ServerUnavailable(f"{failure} (after {self.max_retries} retries)")
            await asyncio.sleep(backoff_s(attempt) if wait is None else wait)
        raise AssertionError("unreachable")

    async def _try(self, payload: bytes, count: int) -> tuple[float | None, Embedded | str]:
        """One request: (None, the result), or (the wait asked for, why it must be retried)."""
        assert self._session is not None, "use EmbeddingsClient as an async context manager"
        headers = {"Content-Type": "application/json"}
        try:
            async with self._session.post(self.endpoint, data=payload, headers=headers) as resp:
                raw = await resp.read()
                status, wait = resp.status, retry_after_s(resp.headers)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return None, f"{self.endpoint}: {exc.__class__.__name__}: {exc}"
        if status == 200:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise ServerRefused(f"{self.endpoint}: HTTP 200 without JSON") from None
            try:
                usage = body.get("usage") or {}
                tokens = int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)
                return None, Embedded(decode(body, count, self.dimensions), tokens)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise ServerRefused(f"{self.endpoint}: a malformed answer ({exc!r})") from None
        message = error_message(status, raw)
        if status == 404:
            message += f" (POST {self.endpoint}: is --url the server's /v1 base?)"
        if status in RETRIED or status >= 500:
            return (None if wait is None else min(wait, MAX_RETRY_AFTER_S)), message
        raise ServerRefused(message)

"""The soak's HTTP load: a few clients posting to ``/v1/embeddings``, in a process of its own.

Each client loops: mostly a valid request (1 text for a query client, 16–64 for a bulk one),
now and then a misbehaving one: an invalid body that must get a 4xx in the JSON error shape, a
connection cut mid-request (during the upload, or while the mesh computes), or a request the
client gives up on before the answer (a short client-side timeout). A probe sends one fixed
text every few seconds and checks its vector against the first answer. Outcomes are counted
in a shared array the parent samples; what went wrong is sent as text on a queue.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import orjson

PROBE_TEXT = "how far is the moon from the earth"
PROBE_TOLERANCE = 1e-3  # same text, other batch shapes: fp32 sums in another order, nothing more
MAX_REPORTED = 200  # error texts sent to the parent; the count goes on regardless


class Outcome(IntEnum):
    """Slots of the shared counter array."""

    OK = 0  # a 200 holding every vector
    OK_TEXTS = 1  # texts embedded by those
    EXPECTED_4XX = 2  # an invalid request answered with its 4xx in the error shape
    DISCONNECTS = 3  # connections we cut mid-request on purpose
    CLIENT_TIMEOUTS = 4  # requests we gave up on before the answer, on purpose
    PROBES = 5  # probe vectors equal to the reference
    UNEXPECTED = 6  # anything else: an error


@dataclass(frozen=True)
class LoadConfig:
    url: str  # http://host:port/v1
    model: str
    query_clients: int = 2
    bulk_clients: int = 1
    query_pause_s: tuple[float, float] = (0.05, 0.5)
    bulk_pause_s: tuple[float, float] = (0.5, 2.0)
    bulk_sizes: tuple[int, int] = (16, 64)
    p_invalid: float = 0.02
    p_disconnect: float = 0.01
    p_timeout: float = 0.01
    probe_every_s: float = 5.0
    request_timeout_s: float = 150.0  # above the mesh's own 120 s: its 504 comes first
    seed: int = 0


# Bodies that break the contract, each with the statuses the ingress documents for it
# (mesh/ingress/http_errors.py): 400 unreadable, 422 a field wrong, 404 unknown model.
INVALID_BODIES: list[tuple[bytes, frozenset[int]]] = [
    (b"{not json", frozenset({400})),
    (b"[1, 2, 3]", frozenset({400})),
    (b'{"input": "no model"}', frozenset({422})),
    (b'{"model": "%MODEL%"}', frozenset({422})),
    (b'{"model": "%MODEL%", "input": []}', frozenset({422})),
    (b'{"model": "%MODEL%", "input": 12}', frozenset({422})),
    (b'{"model": "%MODEL%", "input": "x", "dimensions": -3}', frozenset({422})),
    (b'{"model": "%MODEL%", "input": "x", "encoding_format": "rot13"}', frozenset({422})),
    (b'{"model": "no-such-model", "input": "x"}', frozenset({404})),
]


def classify_embedding(status: int, payload: bytes, texts: int) -> str | None:
    """None for a 200 holding ``texts`` vectors of one positive width, else what is wrong."""
    if status != 200:
        return f"HTTP {status}: {payload[:200]!r}"
    try:
        data = orjson.loads(payload)["data"]
        widths = {len(item["embedding"]) for item in data}
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return f"200 with a malformed body ({type(exc).__name__})"
    if len(data) != texts or len(widths) != 1 or 0 in widths:
        return f"200 with {len(data)} vectors of widths {sorted(widths)} for {texts} texts"
    return None


def classify_invalid(status: int, payload: bytes, expected: frozenset[int]) -> str | None:
    """None when an invalid request got one of ``expected`` in the JSON error shape."""
    if status not in expected:
        return f"invalid request answered {status}, expected {sorted(expected)}: {payload[:200]!r}"
    try:
        error = orjson.loads(payload)["error"]
        ok = isinstance(error, dict) and isinstance(error.get("message"), str)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        ok = False
    return None if ok else f"{status} not in the JSON error shape: {payload[:200]!r}"


class Load:
    """The clients of one load process; ``counters`` and ``events`` are shared with the parent."""

    def __init__(self, cfg: LoadConfig, texts: list[str], counters: Any, events: Any) -> None:
        self.cfg = cfg
        self.texts = texts
        self.counters = counters
        self.events = events
        self.reported = 0
        self.url = cfg.url.rstrip("/") + "/embeddings"
        parts = urlsplit(cfg.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.latencies: dict[str, list[float]] = {"query": [], "bulk": []}

    def count(self, outcome: Outcome, n: int = 1) -> None:
        self.counters[outcome] += n  # one writer (this event loop): no lock needed

    def error(self, what: str) -> None:
        self.count(Outcome.UNEXPECTED)
        if self.reported < MAX_REPORTED:
            self.reported += 1
            self.events.put(("error", f"{time.time():.0f} {what}"))

    async def run(self, stop: Any) -> None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            rng = random.Random(self.cfg.seed)
            clients = [("query", self.cfg.query_pause_s)] * self.cfg.query_clients
            clients += [("bulk", self.cfg.bulk_pause_s)] * self.cfg.bulk_clients
            tasks = [
                asyncio.create_task(
                    self.client(session, kind, pause, random.Random(rng.random()), stop)
                )
                for kind, pause in clients
            ]
            tasks.append(asyncio.create_task(self.probe(session, stop)))
            await asyncio.gather(*tasks)
        self.events.put(("latency", self.latencies))

    async def client(
        self,
        session: aiohttp.ClientSession,
        kind: str,
        pause: tuple[float, float],
        rng: random.Random,
        stop: Any,
    ) -> None:
        cfg = self.cfg
        while not stop.is_set():
            r = rng.random()
            if r < cfg.p_invalid:
                await self.invalid(session, rng)
            elif r < cfg.p_invalid + cfg.p_disconnect:
                await self.disconnect(rng)
            elif r < cfg.p_invalid + cfg.p_disconnect + cfg.p_timeout:
                await self.give_up(session, rng)
            else:
                n = 1 if kind == "query" else rng.randint(*cfg.bulk_sizes)
                await self.embed(session, kind, self.pick(rng, n))
            await asyncio.sleep(rng.uniform(*pause))

    def pick(self, rng: random.Random, n: int) -> list[str]:
        start = rng.randrange(len(self.texts))
        return [self.texts[(start + i) % len(self.texts)] for i in range(n)]

    def body(self, texts: list[str]) -> bytes:
        return orjson.dumps({"model": self.cfg.model, "input": texts})

    async def embed(self, session: aiohttp.ClientSession, kind: str, texts: list[str]) -> None:
        t0 = time.perf_counter()
        try:
            async with session.post(self.url, data=self.body(texts)) as resp:
                problem = classify_embedding(resp.status, await resp.read(), len(texts))
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem = f"{kind}: {type(exc).__name__}: {exc}"
        if problem is None:
            self.count(Outcome.OK)
            self.count(Outcome.OK_TEXTS, len(texts))
            self.latencies[kind].append(time.perf_counter() - t0)
        else:
            self.error(problem)

    async def invalid(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        template, expected = rng.choice(INVALID_BODIES)
        data = template.replace(b"%MODEL%", self.cfg.model.encode())
        try:
            async with session.post(self.url, data=data) as resp:
                problem = classify_invalid(resp.status, await resp.read(), expected)
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem = f"invalid request: {type(exc).__name__}: {exc}"
        if problem is None:
            self.count(Outcome.EXPECTED_4XX)
        else:
            self.error(problem)

    async def give_up(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        """A bulk request abandoned after 20–300 ms: aiohttp closes its connection."""
        texts = self.pick(rng, self.cfg.bulk_sizes[1])
        timeout = aiohttp.ClientTimeout(total=rng.uniform(0.02, 0.3))
        try:
            async with session.post(self.url, data=self.body(texts), timeout=timeout) as resp:
                problem = classify_embedding(resp.status, await resp.read(), len(texts))
        except TimeoutError:
            self.count(Outcome.CLIENT_TIMEOUTS)
            return
        except aiohttp.ClientError as exc:
            problem = f"abandoned request: {type(exc).__name__}: {exc}"
        if problem is None:  # it beat our timeout: an ordinary success
            self.count(Outcome.OK)
            self.count(Outcome.OK_TEXTS, len(texts))
        else:
            self.error(problem)

    async def disconnect(self, rng: random.Random) -> None:
        """A raw connection cut halfway through its body, or after it while the mesh works."""
        body = self.body(self.pick(rng, rng.randint(*self.cfg.bulk_sizes)))
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            _, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            self.error(f"connect for a disconnect: {exc}")
            return
        mid_upload = rng.random() < 0.5
        writer.write(head + (body[: len(body) // 2] if mid_upload else body))
        try:
            await writer.drain()
            await asyncio.sleep(rng.uniform(0.01, 0.2))
        except OSError:
            pass  # the server may close first; either way the connection is gone
        writer.close()
        self.count(Outcome.DISCONNECTS)

    async def probe(self, session: aiohttp.ClientSession, stop: Any) -> None:
        """One fixed text now and then; its vector must not change during the run."""
        reference: np.ndarray | None = None
        while not stop.is_set():
            try:
                async with session.post(self.url, data=self.body([PROBE_TEXT])) as resp:
                    status, payload = resp.status, await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.error(f"probe: {type(exc).__name__}: {exc}")
            else:
                problem = classify_embedding(status, payload, 1)
                if problem is not None:
                    self.error(f"probe: {problem}")
                else:
                    vector = np.asarray(orjson.loads(payload)["data"][0]["embedding"])
                    if reference is None:
                        reference = vector
                    if np.abs(vector - reference).max() <= PROBE_TOLERANCE:
                        self.count(Outcome.PROBES)
                    else:
                        self.error("probe: the vector changed")
            await asyncio.sleep(self.cfg.probe_every_s)


def load_main(cfg: LoadConfig, texts: list[str], counters: Any, events: Any, stop: Any) -> None:
    """Entry point of the load process: run the clients until ``stop`` is set."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    # The clients look at ``stop`` between requests, so the last ones finish cleanly.
    runner(Load(cfg, texts, counters, events).run(stop))

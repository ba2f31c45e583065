"""Load generators against the REST bridge: closed loop, open loop (Poisson), sequential.

aiohttp on one event loop rather than the official ``openai`` client: that client builds a
pydantic model per response and decodes every vector, which costs more CPU per request than
the mesh itself spends on a short query, on the same two cores. Here bodies are serialized
once up front and a response is parsed only for ``usage`` and the number of vectors.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.stats import TIMINGS_HEADER, Sample, even_schedule, parse_timings, poisson_schedule

Body = tuple[bytes, int]  # JSON body, number of texts in it


@dataclass
class Target:
    """Where requests go and how."""

    url: str  # .../v1
    api_key: str | None = None
    timeout_s: float = 120.0

    @property
    def embeddings_url(self) -> str:
        return self.url.rstrip("/") + "/embeddings"

    def session(self, connections: int) -> aiohttp.ClientSession:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            headers=headers,
        )


# Per request rather than on the session: only the lane that asks pays for the timings.
ASK_TIMINGS = {TIMINGS_HEADER: "1"}


async def send(
    session: aiohttp.ClientSession, url: str, body: Body, due: float, timings: bool = False
) -> Sample:
    """One request; latency counts from ``due`` (the open loop's scheduled time).

    ``timings``: ask the ingress for its per-hop timings and keep them in ``Sample.hops``.
    """
    data, texts = body
    try:
        async with session.post(url, data=data, headers=ASK_TIMINGS if timings else None) as resp:
            payload = await resp.read()
            status = str(resp.status)
            hops = parse_timings(resp.headers.get(TIMINGS_HEADER)) if timings else None
    except TimeoutError:
        return Sample(due, time.perf_counter() - due, "timeout", texts)
    except aiohttp.ClientError as exc:
        return Sample(due, time.perf_counter() - due, type(exc).__name__, texts)
    latency = time.perf_counter() - due
    tokens = 0
    if status == "200":
        try:
            answer = orjson.loads(payload)
            tokens = int(answer["usage"]["prompt_tokens"])
            if len(answer["data"]) != texts:
                status = "200-wrong-count"
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            status = "200-bad-body"
    return Sample(due, latency, status, texts, tokens, hops or None)


OnWindow = Callable[[], None] | None  # called when the measured window opens


@dataclass
class Measured:
    """What one load measured: its samples and the window they count over."""

    samples: list[Sample] = field(default_factory=list)
    start_s: float = 0.0  # when the measured window opened, on the samples' clock
    elapsed_s: float = 0.0  # the window's length: the denominator of every rate

    @property
    def end_s(self) -> float:
        return self.start_s + self.elapsed_s


def _at_window(warmup_s: float, on_window: OnWindow) -> None:
    if on_window is not None:
        asyncio.get_running_loop().call_later(warmup_s, on_window)


async def closed_loop(
    target: Target,
    bodies: Sequence[Body],
    concurrency: int,
    *,
    duration_s: float | None = None,
    count: int | None = None,
    warmup_s: float = 0.0,
    on_window: OnWindow = None,
    timings: bool = False,
) -> Measured:
    """``concurrency`` clients, each sending its next request when the last one returns.

    The load runs without a break through ``warmup_s`` and then the measured window. By
    ``duration_s``: the samples are the requests that *completed* inside the window and the
    elapsed time is ``duration_s``, so neither the ramp-up nor the drain at the end (fewer
    requests in flight than clients) dilutes a saturation rate. By ``count``: the first
    ``count`` requests sent after the warm-up, timed to the last answer. ``timings``: every
    request asks for the ingress's per-hop timings (``send``).
    """
    if (duration_s is None) == (count is None):
        raise ValueError("give exactly one of duration_s and count")
    picks = itertools.cycle(bodies)
    issued = itertools.count()
    samples: list[Sample] = []
    start = time.perf_counter()
    window = start + warmup_s
    stop_at = window + duration_s if duration_s is not None else float("inf")

    async def client(session: aiohttp.ClientSession) -> None:
        url = target.embeddings_url
        while True:
            # One clock reading decides both whether the request counts (after the window
            # opened: it takes one of ``count``) and its start: read twice, a request let
            # through as warm-up could start inside the window, one sample too many.
            now = time.perf_counter()
            if now >= stop_at or (count is not None and now >= window and next(issued) >= count):
                return
            samples.append(await send(session, url, next(picks), now, timings))

    _at_window(warmup_s, on_window)
    async with target.session(concurrency) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    if duration_s is not None:
        return Measured([s for s in samples if window <= s.end_s < stop_at], window, duration_s)
    measured = [s for s in samples if s.start_s >= window]
    return Measured(measured, window, max((s.end_s for s in measured), default=window) - window)


async def open_loop(
    target: Target,
    bodies: Sequence[Body],
    rate: float,
    *,
    duration_s: float | None = None,
    count: int | None = None,
    warmup_s: float = 0.0,
    on_window: OnWindow = None,
    seed: int = 0,
    even: bool = False,
    timings: bool = False,
) -> Measured:
    """Poisson arrivals at ``rate`` requests/s (``even``: one every ``1 / rate`` s), whatever
    the answers do.

    Latency counts from each request's scheduled time, so a generator (or server) that falls
    behind shows up in the percentiles instead of hiding (no coordinated omission). The
    samples are the requests due after ``warmup_s``, each awaited; the elapsed time runs to
    the last answer, so a mesh that keeps up shows the offered rate and one that does not,
    less. ``timings``: as in ``closed_loop``.
    """
    if even:
        schedule = even_schedule(rate, duration_s=warmup_s) if warmup_s else []
        measured = even_schedule(rate, duration_s=duration_s, count=count)
    else:
        schedule = poisson_schedule(rate, duration_s=warmup_s, seed=seed + 1) if warmup_s else []
        measured = poisson_schedule(rate, duration_s=duration_s, count=count, seed=seed)
    schedule += [warmup_s + offset for offset in measured]
    picks = itertools.cycle(bodies)
    tasks: list[asyncio.Task[Sample]] = []
    _at_window(warmup_s, on_window)
    async with target.session(0) as session:
        start = time.perf_counter()
        for offset in schedule:
            due = start + offset
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(send(session, target.embeddings_url, next(picks), due, timings))
            )
        samples = [s for s in await asyncio.gather(*tasks) if s.start_s >= start + warmup_s]
    window = start + warmup_s
    return Measured(samples, window, max((s.end_s for s in samples), default=window) - window)


async def sequential(
    target: Target,
    bodies: Sequence[Body],
    count: int,
    *,
    warmup: int = 0,
    on_window: OnWindow = None,
) -> Measured:
    """One request at a time: the latency of a lone query, queueing excluded.

    ``warmup`` requests first, not measured.
    """
    if warmup:
        await closed_loop(target, bodies, 1, count=warmup)
    if on_window is not None:
        on_window()
    return await closed_loop(target, bodies, 1, count=count)

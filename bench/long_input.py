"""What one huge text costs everyone else: short queries timed alone, then while huge texts
are sent (issue 8: "a 2M-word text sent while short queries run delays them by <= 100 ms and
fails none").

    python -m bench.long_input --url http://127.0.0.1:8000/v1 --words 2000000 --queries 200

Queries go one at a time from this process; the huge texts (``--huge`` of them, one after the
other) go from a second task on the same loop, each a single ``input`` string of ``--words``
words, with ``truncation`` left to the server (run it with ``--auto-truncate``, else each
comes back 422 without a second tokenization). Prints the queries' p50 / p99 / max alone and
under the huge texts, the huge requests' statuses and times, and the queries that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import urllib.error
import urllib.request

import aiohttp
import orjson

QUERY = "how can a team keep live search fast while bulk indexing runs"


async def _query(session: aiohttp.ClientSession, url: str, model: str) -> tuple[int, float]:
    body = orjson.dumps({"model": model, "input": QUERY})
    start = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        await r.read()
        return r.status, (time.perf_counter() - start) * 1000


async def _queries(
    session: aiohttp.ClientSession, url: str, model: str, n: int, gap_s: float
) -> list[tuple[int, float]]:
    out = []
    for _ in range(n):
        out.append(await _query(session, url, model))
        await asyncio.sleep(gap_s)
    return out


def _huge(url: str, model: str, words: int, count: int) -> list[tuple[int, float]]:
    """Send the huge texts from a thread of their own: writing megabytes from the queries'
    event loop would delay the queries' own timing, and blame the server for it."""
    # ~5 characters a word, as the 2M-word text of 10 MB.
    text = " ".join(f"w{i % 997}" for i in range(words))
    body = orjson.dumps({"model": model, "input": text})
    out = []
    for _ in range(count):
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as exc:
            exc.read()
            status = exc.code
        out.append((status, (time.perf_counter() - start) * 1000))
    return out


def _summary(name: str, results: list[tuple[int, float]]) -> str:
    ms = sorted(t for status, t in results if status == 200)
    failed = sum(1 for status, _ in results if status != 200)
    if not ms:
        return f"{name}: none ok, {failed} failed"
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return (
        f"{name}: p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms, "
        f"{len(ms)} ok, {failed} failed"
    )


async def main(args: argparse.Namespace) -> None:
    url = args.url.rstrip("/") + "/embeddings"
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _queries(session, url, args.model, 10, 0.0)  # warm-up
        alone = await _queries(session, url, args.model, args.queries, args.gap)
        print(_summary("queries alone", alone))
        huge_task = asyncio.ensure_future(
            asyncio.to_thread(_huge, url, args.model, args.words, args.huge)
        )
        during: list[tuple[int, float]] = []
        while not huge_task.done():
            during += await _queries(session, url, args.model, 1, args.gap)
        huge = huge_task.result()
        print(_summary(f"queries while {args.huge} x {args.words}-word texts were sent", during))
        print("huge texts (status, ms):", [(s, round(t)) for s, t in huge])
        print(f"delay of the p50 query: {_p50(during) - _p50(alone):+.1f} ms")


def _p50(results: list[tuple[int, float]]) -> float:
    ms = [t for status, t in results if status == 200]
    return statistics.median(ms) if ms else float("nan")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--words", type=int, default=2_000_000)
    ap.add_argument("--huge", type=int, default=3, help="huge texts sent, one after the other")
    ap.add_argument("--queries", type=int, default=100, help="queries timed alone")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between queries")
    asyncio.run(main(ap.parse_args()))

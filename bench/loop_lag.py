"""How late an ingress's event loop runs while bulk tokenization goes on beside it.

The event loop carries every live query's hops in an ingress; bulk tokenization runs beside it
on threads (sharing the loop's GIL) or in child processes (``mesh.client.tokenize_procs``).
This times ``asyncio.sleep(0.005)`` on the loop, over and over, while eight coroutines keep
64-text corpus requests of the batch lane in the tokenizer pool, and prints the lateness
percentiles: the delay a live query would see at each visit to the loop.

    python bench/loop_lag.py --processes 0      # bulk on the pool's threads
    python bench/loop_lag.py --processes 3      # bulk in three child processes (the default)
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.corpus import load_texts
from mesh.client.tokenize import TokenizerPool
from mesh.config import BULK_NICE
from mesh.worker.engine.card import default_model_path, read_card
from proto_msgs import Lane, ModelInfo

SLEEP_S = 0.005
REQUESTS_IN_FLIGHT = 8
TEXTS_PER_REQUEST = 64


async def measure(processes: int, threads: int, nice: int, seconds: float) -> list[float]:
    card = read_card(default_model_path())
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, 30522, "mean", True, "d")
    texts = load_texts()
    pool = TokenizerPool(threads, bulk_nice=nice, processes=processes)
    tok = pool.add("d", card.tokenizer_json, info)
    await pool.encode(tok, texts[:TEXTS_PER_REQUEST], True, Lane.BATCH)  # children up
    stop = time.perf_counter() + seconds + 1.5

    async def bulk(k: int) -> None:
        i = k * TEXTS_PER_REQUEST
        while time.perf_counter() < stop:
            batch = [texts[(i + j) % len(texts)] for j in range(TEXTS_PER_REQUEST)]
            i += TEXTS_PER_REQUEST * REQUESTS_IN_FLIGHT
            await pool.encode(tok, batch, True, Lane.BATCH)

    lateness: list[float] = []

    async def probe() -> None:
        await asyncio.sleep(1.0)  # the bulk under way first
        while time.perf_counter() < stop - 0.5:
            started = time.perf_counter()
            await asyncio.sleep(SLEEP_S)
            lateness.append((time.perf_counter() - started - SLEEP_S) * 1000)

    try:
        await asyncio.gather(probe(), *(bulk(k) for k in range(REQUESTS_IN_FLIGHT)))
    finally:
        pool.close()
    return sorted(lateness)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3, help="0: bulk on threads")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--nice", type=int, default=BULK_NICE)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    lags = asyncio.run(measure(args.processes, args.threads, args.nice, args.seconds))

    def q(p: float) -> float:
        return lags[int(p * (len(lags) - 1))]

    print(
        f"processes {args.processes}, threads {args.threads}, nice {args.nice}: loop lateness "
        f"p50 {q(0.5):.2f} p90 {q(0.9):.2f} p99 {q(0.99):.2f} max {lags[-1]:.2f} ms "
        f"({len(lags)} samples)"
    )


if __name__ == "__main__":
    main()

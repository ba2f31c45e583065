"""The probe batch a worker times at start: its shape within the worker's limits, its rate,
and a worker that cannot time it still starts (rate 0: not known)."""

from __future__ import annotations

import time

import numpy as np
import torch

from mesh.worker.probe import PROBE_TOKENS, probe_rate


class TimedEngine:
    """Embeds in ``seconds_per_token`` a token, the first call ``first_s`` more (start-up)."""

    device = torch.device("cpu")
    vocab_size = 50

    def __init__(self, seconds_per_token: float, first_s: float = 0.0) -> None:
        self.seconds_per_token = seconds_per_token
        self.first_s = first_s
        self.batches: list[tuple[np.ndarray, np.ndarray]] = []

    def warmup(self, buckets: list[int], spans: bool = False) -> None:
        pass

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        extra = self.first_s if not self.batches else 0.0
        self.batches.append((ids, offsets))
        time.sleep(len(ids) * self.seconds_per_token + extra)
        return torch.zeros(len(offsets) - 1, 4)


def test_the_probe_is_timed_warm_and_within_the_worker_s_limits() -> None:
    engine = TimedEngine(seconds_per_token=1e-4, first_s=0.5)
    rate = probe_rate(engine, max_batch_tokens=8192, max_input_tokens=64)
    assert len(engine.batches) == 2  # the first, paying start-up, is not the one timed
    ids, offsets = engine.batches[-1]
    assert len(ids) <= PROBE_TOKENS and np.diff(offsets).max() <= 64
    assert ids.max() < engine.vocab_size
    # At most the engine's speed (10,000 tokens/s, sleeping no less), well over the cold run's.
    cold = len(ids) / (len(ids) * 1e-4 + 0.5)
    assert 2 * cold < rate <= 10_000
    small = TimedEngine(seconds_per_token=0.0)
    probe_rate(small, max_batch_tokens=100, max_input_tokens=512)
    assert all(len(ids) <= 100 for ids, _ in small.batches)


def test_an_engine_that_cannot_run_the_probe_gives_no_rate_and_no_failure() -> None:
    class Broken(TimedEngine):
        def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
            raise RuntimeError("this model needs pairs")

    assert probe_rate(Broken(0.0), max_batch_tokens=8192, max_input_tokens=512) == 0.0

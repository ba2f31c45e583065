"""``--max-batch-tokens auto``: the choice rule (curve -> budget), the candidates, the synthetic
batches and the sweep's caps, on a fake engine with a fake clock (no timings decide a test)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from mesh.worker.budget import (
    CPU_RANGE,
    CurvePoint,
    auto_budget,
    budget_is_auto,
    candidates,
    choose_budget,
    measure_curve,
    synthetic_batch,
)


def curve(*rates: tuple[int, float]) -> list[CurvePoint]:
    return [CurvePoint(tokens, rate, tokens / rate) for tokens, rate in rates]


def test_the_smallest_budget_within_the_tolerance_of_the_best_is_chosen() -> None:
    points = curve((256, 5900), (512, 6800), (1024, 7000), (2048, 7200), (4096, 7150))
    assert choose_budget(points, 0.05).tokens == 1024  # 7000 >= 0.95 * 7200
    assert choose_budget(points, 0.01).tokens == 2048
    assert choose_budget(points, 0.2).tokens == 256


def test_a_curve_still_rising_at_its_end_chooses_its_largest_budget() -> None:
    points = curve((1024, 1e6), (2048, 1.9e6), (4096, 3.5e6), (8192, 6e6), (16384, 8e6))
    assert choose_budget(points).tokens == 16384


def test_a_noisy_dip_below_the_knee_does_not_move_the_choice_past_it() -> None:
    points = curve((512, 6900), (1024, 4000), (2048, 7000), (4096, 7100))
    assert choose_budget(points).tokens == 512


def test_an_empty_curve_is_refused() -> None:
    with pytest.raises(ValueError):
        choose_budget([])


def test_cpu_candidates_are_powers_of_two_from_the_longest_input() -> None:
    assert candidates("cpu", 256) == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert candidates("cpu", 512)[0] == 512 and candidates("cpu", 512)[-1] == CPU_RANGE[1]


def test_the_longest_input_always_fits_the_first_candidate() -> None:
    assert candidates("cpu", 300)[:2] == [300, 512]
    assert candidates("cpu", 8192) == [8192, 16384]
    assert candidates("cpu", 100_000) == [100_000]  # one batch must hold any one input


def test_cuda_candidates_stop_at_the_largest_graph_bucket() -> None:
    assert candidates("cuda", 512, 16384) == [1024, 2048, 4096, 8192, 16384]
    assert candidates("cuda", 512)[-1] == 65536
    assert candidates("cuda", 256, 512) == [512]  # buckets capped low: the largest one


def test_a_model_of_short_inputs_starts_at_the_range() -> None:
    assert candidates("cpu", 128)[:2] == [256, 512]


def test_a_synthetic_batch_holds_exactly_its_tokens_in_realistic_sequences() -> None:
    ids, offsets = synthetic_batch(4096, 256, 30522)
    lengths = np.diff(offsets)
    assert ids.shape == (4096,) and ids.dtype == np.int32 and offsets[-1] == 4096
    assert lengths.min() >= 1 and lengths.max() <= 256 and len(lengths) > 10
    assert ids.min() >= 1000 and ids.max() < 30522
    again = synthetic_batch(4096, 256, 30522)
    assert np.array_equal(ids, again[0]) and np.array_equal(offsets, again[1])
    assert np.diff(synthetic_batch(512, 8, 100)[1]).max() <= 8  # a model of short inputs


def test_auto_is_the_default_on_cpu_only() -> None:
    assert budget_is_auto(None, "cpu") and budget_is_auto("auto", "cuda:0")
    assert not budget_is_auto(None, "cuda") and not budget_is_auto(4096, "cpu")


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeCard:
    max_input_tokens: int = 256


@dataclass
class FakeEngine:
    """Advances the clock by each batch's time on a made-up curve: a fixed 20 ms a batch plus
    10k tokens a second; ``oom_at``: batches of that many tokens or more run out of memory."""

    clock: FakeClock
    oom_at: int = 1 << 30
    device: torch.device = torch.device("cpu")
    card: FakeCard = field(default_factory=FakeCard)
    vocab_size: int = 30522
    runs: list[int] = field(default_factory=list)
    gpu_runner: None = None

    def warmup(self, buckets: list[int]) -> None:
        pass

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        if len(ids) >= self.oom_at:
            raise torch.cuda.OutOfMemoryError("fake")
        self.runs.append(len(ids))
        self.clock.now += 0.020 + len(ids) / 10_000


def test_the_sweep_measures_each_size_and_stops_before_a_batch_too_long() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock)
    points = measure_curve(engine, [256, 512, 1024, 2048, 4096, 8192], 0.4, 2, clock)  # type: ignore[arg-type]
    # 4096 tokens at the best rate so far (2048 in 0.2248 s) would take 0.45 s: not run.
    assert [p.tokens for p in points] == [256, 512, 1024, 2048]
    assert points[-1].tokens_per_s == pytest.approx(2048 / 0.2248)
    # One warm-up run on a CPU, then two timed runs a size.
    assert engine.runs == [256, 256, 256, 512, 512, 1024, 1024, 2048, 2048]
    assert choose_budget(points).tokens == 2048  # still rising by more than 5% a step


def test_a_size_that_runs_out_of_memory_ends_the_sweep() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, oom_at=2048)
    points = measure_curve(engine, [256, 512, 1024, 2048, 4096], 10.0, 2, clock)  # type: ignore[arg-type]
    assert [p.tokens for p in points] == [256, 512, 1024]


def test_a_sweep_past_its_time_settles_for_two_points() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock)
    # Every batch well over the point cap: three points within the sweep's time, two past it.
    points = measure_curve(engine, [256, 512, 1024, 2048], 0.001, 2, clock, 3, 10.0)  # type: ignore[arg-type]
    assert [p.tokens for p in points] == [256, 512, 1024]
    clock.now, engine.runs = 0.0, []
    points = measure_curve(engine, [256, 512, 1024, 2048], 0.001, 2, clock, 3, 0.1)  # type: ignore[arg-type]
    assert [p.tokens for p in points] == [256, 512]


def test_a_model_of_inputs_as_long_as_the_default_budget_keeps_it_unmeasured() -> None:
    # Candidates 8,192 (the CPU default: an input over it is refused as by default) and 16,384;
    # the first runs out of memory, so nothing is measured and the floor stands.
    engine = FakeEngine(FakeClock(), oom_at=0, card=FakeCard(max_input_tokens=32768))
    chosen = auto_budget(engine)  # type: ignore[arg-type]
    assert (chosen.tokens, chosen.tokens_per_s) == (8192, 0.0) and engine.runs == []


def test_auto_on_a_short_input_model_sweeps_from_its_longest_input() -> None:
    engine = FakeEngine(FakeClock())
    chosen = auto_budget(engine)  # type: ignore[arg-type]
    assert engine.runs[0] == 256 and chosen.tokens in candidates("cpu", 256)
    assert chosen.tokens_per_s > 0

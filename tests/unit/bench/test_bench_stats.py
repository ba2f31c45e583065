"""The report math of mesh-bench: percentiles, rates, and the seeded Poisson schedule."""

from __future__ import annotations

import math
import pickle
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.stats import (
    Sample,
    cdf_ms,
    even_schedule,
    hop_percentiles,
    hops_summary,
    percentile,
    poisson_schedule,
    summarize,
    timeline,
)


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 0) == 15.0
    assert percentile(values, 50) == 35.0
    assert percentile(values, 100) == 50.0
    assert percentile(values, 90) == pytest.approx(46.0)  # 40 + 0.6 * (50 - 40)


def test_percentile_of_one_value_is_that_value_and_of_none_is_nan() -> None:
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_percentile_ignores_input_order() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_percentile_outside_0_to_100_is_refused() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200),
    st.floats(0, 100),
)
def test_percentile_agrees_with_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


def test_poisson_schedule_is_reproducible_for_a_seed_and_differs_across_seeds() -> None:
    a = poisson_schedule(50, count=100, seed=3)
    assert a == poisson_schedule(50, count=100, seed=3)
    assert a != poisson_schedule(50, count=100, seed=4)


def test_poisson_schedule_gaps_are_exponential_with_mean_one_over_rate() -> None:
    offsets = poisson_schedule(200, count=20_000, seed=0)
    gaps = np.diff([0.0, *offsets])
    assert len(offsets) == 20_000
    assert (gaps > 0).all()
    assert gaps.mean() == pytest.approx(1 / 200, rel=0.03)
    # For an exponential distribution the standard deviation equals the mean.
    assert gaps.std() == pytest.approx(1 / 200, rel=0.05)


def test_poisson_schedule_by_duration_stays_inside_it_with_about_rate_times_duration() -> None:
    offsets = poisson_schedule(100, duration_s=60, seed=1)
    assert offsets == sorted(offsets)
    assert offsets[0] > 0 and offsets[-1] < 60
    assert len(offsets) == pytest.approx(6000, rel=0.05)


def test_poisson_schedule_needs_exactly_one_bound_and_a_positive_rate() -> None:
    with pytest.raises(ValueError):
        poisson_schedule(10)
    with pytest.raises(ValueError):
        poisson_schedule(10, count=5, duration_s=1)
    with pytest.raises(ValueError):
        poisson_schedule(0, count=5)


def _sample(latency_ms: float, status: str = "200", texts: int = 1, tokens: int = 10) -> Sample:
    return Sample(0.0, latency_ms / 1000, status, texts, tokens if status == "200" else 0)


def test_summarize_counts_rates_over_successes_and_errors_by_status() -> None:
    samples = [_sample(ms, texts=2, tokens=30) for ms in (10, 20, 30, 40)]
    samples += [_sample(5, "429"), _sample(5, "429"), _sample(900, "timeout")]
    stats = summarize(samples, elapsed_s=2.0)
    assert (stats.requests, stats.ok) == (7, 4)
    assert stats.errors == {"429": 2, "timeout": 1}
    assert stats.requests_per_s == 2.0
    assert stats.texts_per_s == 4.0
    assert stats.tokens == 120 and stats.tokens_per_s == 60.0
    # Latency percentiles describe answered requests only: fast refusals must not flatter them.
    assert stats.latency_ms["p50"] == pytest.approx(25.0)
    assert stats.latency_ms["p99"] == pytest.approx(39.7)
    assert stats.latency_ms["mean"] == pytest.approx(statistics.mean([10, 20, 30, 40]))
    assert stats.latency_ms["max"] == pytest.approx(40.0)


def test_summarize_with_no_success_reports_nan_latency_and_zero_rates() -> None:
    stats = summarize([_sample(3, "503")], elapsed_s=1.0)
    assert stats.ok == 0 and stats.tokens_per_s == 0.0
    assert math.isnan(stats.latency_ms["p50"])


def test_summarize_needs_a_positive_window() -> None:
    with pytest.raises(ValueError):
        summarize([], elapsed_s=0)


def test_even_schedule_spaces_arrivals_by_one_period_inside_the_duration() -> None:
    assert even_schedule(4, count=3) == [0.25, 0.5, 0.75]
    assert even_schedule(10, duration_s=0.5) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError):
        even_schedule(0, count=1)


def test_cdf_ms_runs_from_the_minimum_to_the_maximum_in_order() -> None:
    points = cdf_ms([5.0, 1.0, 3.0, 2.0, 4.0], step=25)
    assert points == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(cdf_ms([1.0] * 1000)) == 201  # 0.5-percentile steps, whatever the sample count
    assert cdf_ms([]) == []


def test_timeline_bins_successes_by_completion_time_inside_the_window() -> None:
    samples = [
        Sample(10.0, 0.55, "200", 1, 100),  # ends at 10.55: bin 5
        Sample(10.0, 1.55, "200", 1, 100),  # ends at 11.55: bin 15
        Sample(10.0, 1.6, "503", 1),  # errors do not count
        Sample(9.0, 0.5, "200", 1, 100),  # ended before the window
    ]
    t = timeline(samples, start_s=10.0, elapsed_s=2.0)
    assert t["bin_s"] == pytest.approx(0.1) and len(t["tokens_per_s"]) == 20
    assert sum(t["tokens_per_s"]) * t["bin_s"] == pytest.approx(200)
    assert t["tokens_per_s"][5] == pytest.approx(1000) and t["tokens_per_s"][15] == pytest.approx(
        1000
    )
    assert len(timeline(samples, 0.0, 60.0)["tokens_per_s"]) == 60  # 1 s bins in long windows


def _hopped(latency_ms: float, hops: dict[str, float] | None, status: str = "200") -> Sample:
    return Sample(0.0, latency_ms / 1000, status, 1, 3, hops)


def test_hops_summary_is_p50_and_p99_per_hop_over_the_samples_that_carry_hops() -> None:
    samples = [
        _hopped(10.0, {"broker_queue": 1.0, "worker_compute": 4.0, "ingress_total": 8.0}),
        _hopped(20.0, {"broker_queue": 3.0, "worker_compute": 6.0, "ingress_total": 17.0}),
        _hopped(30.0, {"broker_queue": 2.0, "worker_compute": 5.0, "worker_reply": 0.5}),
        # Left out: no hops asked for (a bulk sample), none answered, and a failed request.
        _hopped(900.0, None),
        _hopped(900.0, {}),
        _hopped(900.0, {"broker_queue": 500.0, "ingress_total": 1.0}, status="503"),
    ]
    summary = hops_summary(samples)
    assert list(summary) == ["p50", "p99"]
    p50, p99 = summary["p50"], summary["p99"]
    assert list(p50) == [
        "broker_queue", "worker_compute", "ingress_total", "outside_ingress", "worker_reply"
    ]  # fmt: skip
    assert p50["broker_queue"] == 2.0 and p50["worker_compute"] == 5.0
    assert p50["worker_reply"] == 0.5 == p99["worker_reply"]  # one sample reported it
    assert p99["broker_queue"] == pytest.approx(2.98)  # 2 + 0.98 * (3 - 2)
    # Latency minus ingress_total, over the two samples whose ingress reported a total.
    assert p50["outside_ingress"] == pytest.approx(2.5)  # median of 2 and 3
    assert p99["outside_ingress"] == pytest.approx(2.99)


def test_hops_summary_of_samples_without_hops_is_empty() -> None:
    assert hops_summary([_hopped(5.0, None), _hopped(6.0, None)]) == {}
    assert hops_summary([]) == {}


def test_hop_percentiles_keys_each_percentile_and_keeps_first_seen_hop_order() -> None:
    timings = [{"b": 2.0, "a": 1.0}, {"a": 3.0}]
    assert hop_percentiles(timings, (50, 100)) == {
        "p50": {"b": 2.0, "a": 2.0},
        "p100": {"b": 2.0, "a": 3.0},
    }


def test_a_sample_with_hops_pickles_and_still_hashes() -> None:
    # Load processes send their samples back pickled (bench.procs).
    sample = _hopped(12.0, {"broker_queue": 0.25, "ingress_total": 10.0})
    back = pickle.loads(pickle.dumps(sample))
    assert back == sample and back.hops == {"broker_queue": 0.25, "ingress_total": 10.0}
    assert len({sample, back}) == 1

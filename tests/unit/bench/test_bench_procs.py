"""``--procs N``: the load cut into per-process jobs, and the merge of what each process saw."""

from __future__ import annotations

import asyncio

import pytest

from bench import procs
from bench.corpus import request_bodies
from bench.load import Measured
from bench.procs import Job, Timing, closed_jobs, merge, merge_lanes, open_jobs, split
from bench.stats import Sample, summarize

BODIES = request_bodies([f"text {i}" for i in range(12)], "m", 1)


def test_split_shares_differ_by_at_most_one_and_sum_to_the_total() -> None:
    assert split(10, 3) == [4, 3, 3]
    assert split(2, 4) == [1, 1]  # fewer clients than processes: no idle process
    assert sum(split(1001, 7)) == 1001
    with pytest.raises(ValueError):
        split(5, 0)


def test_closed_jobs_share_the_clients_and_the_count_and_start_at_different_bodies() -> None:
    jobs = closed_jobs("", BODIES, 16, 3, count=100)
    assert [j.concurrency for j in jobs] == [6, 5, 5]
    assert sum(j.count or 0 for j in jobs) == 100
    assert len({j.first for j in jobs}) == 3


def test_open_jobs_share_the_rate_with_independent_seeds() -> None:
    jobs = open_jobs("live", BODIES, 30.0, 3, seed=7, even=True)
    assert sum(j.rate for j in jobs) == pytest.approx(30.0)
    assert len({j.seed for j in jobs}) == 3
    assert all(j.even and j.lane == "live" and j.count is None for j in jobs)


def test_a_job_is_either_a_closed_or_an_open_loop() -> None:
    with pytest.raises(ValueError):
        Job("", BODIES, concurrency=2, rate=1.0)
    with pytest.raises(ValueError):
        Job("", BODIES)


def _m(starts: list[float], tokens: int, start: float, elapsed: float, errors: int = 0) -> Measured:
    samples = [Sample(t, 0.01, "200", 1, tokens) for t in starts]
    samples += [Sample(start, 0.01, "503", 1)] * errors
    return Measured(samples, start, elapsed)


def test_merge_concatenates_samples_and_sums_rates_over_the_common_window() -> None:
    a = _m([1.0, 1.5, 2.0], 10, start=1.0, elapsed=2.0)
    b = _m([1.2, 2.2], 10, start=1.0, elapsed=2.0, errors=3)
    merged = merge([a, b])
    assert (merged.start_s, merged.elapsed_s) == (1.0, 2.0)
    stats = summarize(merged.samples, merged.elapsed_s)
    alone = [summarize(p.samples, p.elapsed_s) for p in (a, b)]
    assert stats.requests_per_s == pytest.approx(sum(s.requests_per_s for s in alone))
    assert stats.tokens_per_s == pytest.approx(sum(s.tokens_per_s for s in alone))
    assert stats.errors == {"503": 3}
    assert stats.ok == 5


def test_merge_takes_the_union_of_windows_that_do_not_coincide() -> None:
    merged = merge([_m([], 0, start=1.0, elapsed=2.0), _m([], 0, start=1.5, elapsed=2.0)])
    assert (merged.start_s, merged.elapsed_s) == (1.0, 2.5)
    with pytest.raises(ValueError):
        merge([])


def test_merge_lanes_keeps_lanes_apart_in_first_seen_order() -> None:
    lanes = merge_lanes(
        [("bulk", _m([1.0], 5, 0, 1)), ("live", _m([1.1], 1, 0, 1)), ("bulk", _m([1.2], 5, 0, 1))]
    )
    assert list(lanes) == ["bulk", "live"]
    assert len(lanes["bulk"].samples) == 2 and len(lanes["live"].samples) == 1


async def test_jobs_on_one_loop_run_together_with_times_from_their_common_start(
    stub_target,
) -> None:
    stub, target = stub_target
    jobs = [Job("bulk", BODIES, concurrency=3, count=9), Job("live", BODIES, rate=50.0, count=4)]
    opened: list[int] = []
    lanes = await asyncio.to_thread(
        procs.run, target, [jobs], Timing(None), lambda: opened.append(1), spawn=False
    )
    assert len(lanes["bulk"].samples) == 9 and len(lanes["live"].samples) == 4
    assert stub.calls == 13 and opened == [1]
    # Relative to the start: small non-negative times, not perf_counter's epoch.
    assert all(0 <= s.start_s < 60 for m in lanes.values() for s in m.samples)


async def test_only_a_job_that_asks_for_timings_gets_hops(stub_target) -> None:
    _, target = stub_target
    jobs = [
        Job("bulk", BODIES, concurrency=2, count=4),
        *open_jobs("live", BODIES, 50.0, 1, count=3, even=True, timings=True),
    ]
    lanes = await asyncio.to_thread(procs.run, target, [jobs], Timing(None), spawn=False)
    assert all(s.hops is None for s in lanes["bulk"].samples)
    live = lanes["live"].samples
    assert len(live) == 3 and all(s.hops and s.hops["client_mesh"] == 1.5 for s in live)


@pytest.mark.timeout(120)
async def test_spawned_load_processes_each_send_their_share_and_results_merge(
    stub_target,
) -> None:
    stub, target = stub_target
    stub.delay_s = 0.02
    per_process = [[j] for j in closed_jobs("", BODIES, 4, 2, count=20)]
    lanes = await asyncio.to_thread(procs.run, target, per_process, Timing(None))
    merged = lanes[""]
    assert len(merged.samples) == 20 == stub.calls
    assert all(s.ok and s.tokens == 3 for s in merged.samples)
    assert stub.peak == 4  # two processes of two clients each, at once
    assert merged.elapsed_s > 0


@pytest.mark.timeout(120)
async def test_a_load_process_that_fails_is_reported_not_hung(stub_target) -> None:
    _, target = stub_target
    broken = [[Job("", [], concurrency=1, count=1)]]  # no bodies: the child raises
    with pytest.raises(RuntimeError, match="load process .* failed"):
        await asyncio.to_thread(procs.run, target, broken, Timing(None))

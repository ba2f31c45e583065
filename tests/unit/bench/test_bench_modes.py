"""What each mode sends: closed/open cut over --procs, and mixed's two windows and two lanes."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from bench import procs
from bench.modes import BULK, BULK_ALONE, LIVE, Workload, phases

WORK = Workload([f"passage {i}" for i in range(256)], [f"query {i}" for i in range(20)])


def _options(**over: Any) -> dict[str, Any]:
    o = {
        "procs": 1,
        "requests": None,
        "duration": 2.0,
        "warmup": 0.5,
        "concurrency": 8,
        "texts_per_request": 1,
        "rate": None,
        "seed": 0,
        "live_rate": 10.0,
        "bulk_texts_per_request": 64,
        "model_name": "m",
        "encoding_format": "base64",
        "priority": "auto",
    }
    return o | over


def _body(job: procs.Job) -> dict[str, Any]:
    return orjson.loads(job.bodies[0][0])


def test_closed_with_one_process_runs_on_the_bench_loop_and_with_n_in_n_processes() -> None:
    (one,) = phases("closed", WORK, _options())
    assert not one.spawn and len(one.per_process) == 1
    (four,) = phases("closed", WORK, _options(procs=4))
    assert four.spawn and [g[0].concurrency for g in four.per_process] == [2, 2, 2, 2]
    assert "priority" not in _body(four.per_process[0][0])  # auto: the ingress picks


def test_open_shares_its_rate_over_the_processes() -> None:
    (phase,) = phases("open", WORK, _options(procs=2, rate=40.0))
    assert [g[0].rate for g in phase.per_process] == [20.0, 20.0]
    with pytest.raises(ValueError, match="--rate"):
        phases("open", WORK, _options())


def test_an_explicit_priority_goes_into_every_body() -> None:
    (phase,) = phases("closed", WORK, _options(priority="batch"))
    assert all(orjson.loads(b)["priority"] == "batch" for b, _ in phase.per_process[0][0].bodies)


def test_mixed_measures_bulk_alone_then_bulk_with_live_queries_for_the_same_time() -> None:
    alone, mixed = phases("mixed", WORK, _options(procs=2))
    assert alone.timing == mixed.timing
    assert [j.lane for g in alone.per_process for j in g] == [BULK_ALONE, BULK_ALONE]
    lanes = [[j.lane for j in g] for g in mixed.per_process]
    # The bulk over --procs processes, the live queries in a process of their own.
    assert lanes == [[BULK], [BULK], [LIVE]]
    bulk, live = mixed.per_process[0][0], mixed.per_process[2][0]
    assert sum(g[0].concurrency for g in mixed.per_process[:2]) == 8
    assert live.rate == 10.0 and live.even and live.concurrency == 0
    assert _body(bulk)["priority"] == "batch" and len(_body(bulk)["input"]) == 64
    assert _body(live)["priority"] == "interactive" and _body(live)["input"].startswith("query")
    assert set(mixed.loads) == {BULK, LIVE} and alone.spawn and mixed.spawn


def test_only_the_live_queries_of_mixed_ask_for_per_hop_timings() -> None:
    alone, mixed = phases("mixed", WORK, _options(procs=2))
    asks = {j.lane: j.timings for p in (alone, mixed) for g in p.per_process for j in g}
    assert asks == {BULK_ALONE: False, BULK: False, LIVE: True}
    for mode, extra in (("closed", {}), ("open", {"rate": 10.0})):
        (phase,) = phases(mode, WORK, _options(procs=2, **extra))
        assert not any(j.timings for g in phase.per_process for j in g)


def test_mixed_needs_a_duration_and_a_live_rate() -> None:
    with pytest.raises(ValueError):
        phases("mixed", WORK, _options(requests=100))
    with pytest.raises(ValueError):
        phases("mixed", WORK, _options(live_rate=0.0))


@pytest.mark.timeout(120)
async def test_mixed_against_a_stub_reports_both_lanes_with_their_own_priorities(
    stub_target,
) -> None:
    stub, target = stub_target
    o = _options(concurrency=2, duration=1.0, warmup=0.2, live_rate=20.0)
    alone, mixed = phases("mixed", WORK, o)
    solo = await asyncio.to_thread(procs.run, target, alone.per_process, alone.timing)
    sent_alone = stub.calls
    both = await asyncio.to_thread(procs.run, target, mixed.per_process, mixed.timing)
    assert list(solo) == [BULK_ALONE] and set(both) == {BULK, LIVE}
    assert set(stub.priorities[:sent_alone]) == {"batch"}
    assert set(stub.priorities[sent_alone:]) == {"batch", "interactive"}
    live = both[LIVE]
    assert live.samples and all(s.texts == 1 and s.ok for s in live.samples)
    assert both[BULK].samples and all(s.texts == 64 for s in both[BULK].samples)
    # Both windows are as long as asked: bulk alone and bulk with live compare like for like.
    assert solo[BULK_ALONE].elapsed_s == pytest.approx(both[BULK].elapsed_s) == pytest.approx(1.0)


def test_mixed_with_several_live_rates_measures_bulk_alone_once_then_a_window_per_rate() -> None:
    planned = phases("mixed", WORK, _options(live_rate=(0.2, 1.0, 5.0, 20.0)))
    assert [set(p.loads) for p in planned] == [{BULK_ALONE}] + [{BULK, LIVE}] * 4
    lives = [p.loads[LIVE] for p in planned[1:]]
    assert lives == [f"{r}/s x1 query, interactive lane" for r in ("0.2", "1", "5", "20")]
    assert planned[1].loads[BULK].endswith("beside 0.2/s live")
    with pytest.raises(ValueError):
        phases("mixed", WORK, _options(live_rate=(5.0, 0.0)))

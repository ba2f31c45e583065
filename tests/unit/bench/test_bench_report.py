"""mesh-bench's workload bodies and its report (table and JSON)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import orjson
import pytest

from bench.baseline import BaselineResult
from bench.corpus import load_texts, request_bodies
from bench.host import CpuUse
from bench.report import Report, Run
from bench.stats import Sample, hops_summary, summarize


def test_request_bodies_group_texts_and_keep_a_single_text_a_string() -> None:
    bodies = request_bodies(["a", "b", "c"], "m", 2, "base64")
    assert [n for _, n in bodies] == [2, 1]
    first, last = (orjson.loads(b) for b, _ in bodies)
    assert first == {"model": "m", "input": ["a", "b"], "encoding_format": "base64"}
    assert last["input"] == "c"


def test_load_texts_filters_by_kind_and_names_a_missing_file(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    rows = [{"text": "q1", "kind": "query"}, {"text": "p1", "kind": "passage"}]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_texts(corpus) == ["q1", "p1"]
    assert load_texts(corpus, kind="query") == ["q1"]
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_texts(tmp_path / "nope.jsonl")


def _report() -> Report:
    baseline = BaselineResult(
        "model",
        100,
        12_000,
        2,
        {
            8: {"seconds": 3.0, "tokens_per_s": 4000.0, "texts_per_s": 33.3},
            32: {"seconds": 4.0, "tokens_per_s": 3000.0, "texts_per_s": 25.0},
        },
        {2048: {"seconds": 2.0, "tokens_per_s": 6000.0, "texts_per_s": 50.0}},
    )
    samples = [Sample(0.0, 0.02, "200", 1, 100)] * 50 + [Sample(0.0, 0.001, "429", 1)]
    report = Report(args={"mode": ["closed"]}, baseline=baseline)
    cpu = CpuUse(0.3, {"worker": 1.5, "ingress": 0.25})
    report.runs.append(Run("--workers 1", "closed", "4 clients x1", summarize(samples, 1.0), cpu))
    return report


def test_the_ratio_compares_with_the_best_baseline_batch_size() -> None:
    report = _report()
    assert report.baseline is not None and report.baseline.best["batch_size"] == 8
    assert report.ratio(report.runs[0]) == pytest.approx(5000 / 4000)


def test_table_shows_each_run_the_baseline_and_the_errors() -> None:
    table = _report().table()
    assert "--workers 1" in table and "1.25x" in table and "5000" in table
    assert "batch 8" in table and "batch 32" in table
    engine_row = next(line for line in table.splitlines() if "budget 2048" in line)
    assert "embedmesh engine alone" in engine_row and "1.50x" in engine_row
    assert "{'429': 1}" in table
    assert "worker 1.50, ingress 0.25" in table
    assert "other processes took 30% of the CPUs" in table


def test_json_report_carries_machine_baseline_and_runs() -> None:
    data = json.loads(_report().as_json())
    assert data["machine"]["nproc"] >= 1
    assert data["baseline"]["best"]["tokens_per_s"] == 4000.0
    run = data["runs"][0]
    assert run["tokens_per_s"] == 5000.0 and run["errors"] == {"429": 1}
    assert run["other_cpu"] == 0.3 and run["cpu_cores_by_role"]["worker"] == 1.5
    assert set(run["latency_ms"]) == {"p50", "p90", "p99", "mean", "max"}


def test_a_run_with_much_steal_gets_a_warning() -> None:
    report = _report()
    report.runs[0].cpu = CpuUse(0.0, {"worker": 1.9}, steal=0.25)
    assert "the hypervisor stole 25%" in report.table()


def _mixed_report() -> Report:
    report = Report(args={"mode": ["mixed"]})
    bulk = [Sample(0.0, 0.5, "200", 64, 8000)] * 10
    live = [Sample(0.0, 0.004 * (i + 1), "200", 1, 18) for i in range(10)]
    alone = Run(
        "--ingress-procs 2", "mixed", "8 clients x64", summarize(bulk, 1.0), lane="bulk alone"
    )
    both = Run("--ingress-procs 2", "mixed", "8 clients x64", summarize(bulk[:9], 1.0), lane="bulk")
    both.vs_alone = 0.9
    report.runs += [
        alone,
        both,
        Run("--ingress-procs 2", "mixed", "10/s", summarize(live, 1.0), lane="live"),
    ]
    report.configs["--ingress-procs 2"] = "mesh-launch --role all --ingress-procs 2"
    return report


def test_a_mixed_run_reports_both_lanes_and_the_bulk_rate_against_bulk_alone() -> None:
    report = _mixed_report()
    table = report.table()
    assert "mixed live" in table and "mixed bulk alone" in table
    line = next(x for x in table.splitlines() if x.startswith("mixed in --ingress-procs 2"))
    assert "0.90x of bulk alone" in line and "live p50/p90/p99" in line
    assert "config '--ingress-procs 2': mesh-launch --role all --ingress-procs 2" in table


def test_with_several_live_rates_each_bulk_window_is_paired_with_its_own_live_run() -> None:
    report = _mixed_report()
    config = "--ingress-procs 2"
    fast = [Sample(0.0, 0.002, "200", 1, 18)] * 10
    second = Run(config, "mixed", "8 clients x64", summarize([], 1.0), lane="bulk")
    second.vs_alone = 0.5
    report.runs += [second, Run(config, "mixed", "20/s", summarize(fast, 1.0), lane="live")]
    lines = [x for x in report.table().splitlines() if x.startswith("mixed in ")]
    assert len(lines) == 2
    assert "beside live 10/s" in lines[0] and "0.90x" in lines[0] and "p50/p90/p99 22.0" in lines[0]
    assert "beside live 20/s" in lines[1] and "0.50x" in lines[1] and "p50/p90/p99 2.0" in lines[1]


def test_the_live_lane_is_not_compared_with_the_baseline_throughput() -> None:
    report = _mixed_report()
    report.baseline = _report().baseline
    live = next(r for r in report.runs if r.lane == "live")
    bulk = next(r for r in report.runs if r.lane == "bulk")
    assert math.isnan(report.ratio(live)) and not math.isnan(report.ratio(bulk))


def test_json_carries_lanes_configs_and_the_bulk_ratio() -> None:
    data = json.loads(_mixed_report().as_json())
    assert [r["lane"] for r in data["runs"]] == ["bulk alone", "bulk", "live"]
    assert data["runs"][1]["vs_alone"] == 0.9 and data["runs"][0]["vs_alone"] is None
    assert data["configs"] == {"--ingress-procs 2": "mesh-launch --role all --ingress-procs 2"}


def _hopped_report() -> Report:
    report = _mixed_report()
    hops = [
        {"broker_queue": 0.1 * (i + 1), "worker_compute": 2.0, "ingress_total": 3.0}
        for i in range(10)
    ]
    live = [Sample(0.0, 0.004, "200", 1, 18, h) for h in hops]
    report.runs[2] = Run(
        "--ingress-procs 2", "mixed", "10/s", summarize(live, 1.0), lane="live",
        hops_ms=hops_summary(live),
    )  # fmt: skip
    return report


def test_json_carries_each_runs_per_hop_p50_and_p99() -> None:
    runs = json.loads(_hopped_report().as_json())["runs"]
    assert [r["hops_ms"] for r in runs[:2]] == [{}, {}]  # the bulk did not ask
    live = runs[2]["hops_ms"]
    assert set(live) == {"p50", "p99"}
    assert live["p50"]["worker_compute"] == 2.0
    assert live["p50"]["broker_queue"] == pytest.approx(0.55)
    assert live["p99"]["outside_ingress"] == pytest.approx(1.0)  # 4 ms - 3 ms in the ingress


def test_table_has_one_hops_line_for_the_lane_that_has_hops() -> None:
    lines = [x for x in _hopped_report().table().splitlines() if " hops in " in x]
    assert lines == [
        "live hops in --ingress-procs 2, p50/p99 ms: broker_queue 0.55/0.99, "
        "worker_compute 2.00/2.00, ingress_total 3.00/3.00, outside_ingress 1.00/1.00"
    ]
    assert " hops in " not in _mixed_report().table()  # no run with hops: no line

"""mesh-bench's PNG plots, rendered from a synthetic report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from bench.plots import main, write_plots  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(config: str, mode: str, lane: str, scale: float) -> dict:
    return {
        "config": config,
        "mode": mode,
        "lane": lane,
        "cdf_ms": [scale * (1 + i / 50) for i in range(201)],
        "timeline": {"bin_s": 1.0, "tokens_per_s": [1000 * scale + i for i in range(30)]},
    }


def _report() -> dict:
    runs = [
        _run("(defaults)", "closed", "", 1.0),
        _run("--ingress-procs 2", "mixed", "bulk alone", 2.0),
        _run("--ingress-procs 2", "mixed", "bulk", 1.8),
        _run("--ingress-procs 2", "mixed", "live", 0.01),
        {"config": "(defaults)", "mode": "latency", "lane": "", "cdf_ms": [], "timeline": {}},
    ]
    hops = [
        {
            "config": "(defaults)",
            "ways": {
                "engine": {"p50_ms": 0.3, "hops_p50_ms": {"tokenize": 0.05}, "skipped": ""},
                "client": {"p50_ms": None, "hops_p50_ms": {}, "skipped": "no broker"},
                "http": {"p50_ms": 3.1, "hops_p50_ms": {"ingress_parse": 0.02}, "skipped": ""},
            },
        }
    ]
    return {"runs": runs, "hops": hops}


def test_plots_are_written_as_non_trivial_pngs(tmp_path: Path) -> None:
    paths = write_plots(_report(), tmp_path / "plots", "r1")
    names = sorted(p.name for p in paths)
    assert names == ["r1-hops.png", "r1-latency-cdf.png", "r1-throughput.png"]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_a_report_without_lanes_or_hops_makes_only_what_it_has_data_for(tmp_path: Path) -> None:
    report = {"runs": [_run("(defaults)", "closed", "", 1.0)], "hops": []}
    assert [p.name for p in write_plots(report, tmp_path)] == [
        "mesh-bench-latency-cdf.png",
        "mesh-bench-throughput.png",
    ]
    assert write_plots({"runs": [], "hops": []}, tmp_path / "empty") == []


def test_a_saved_json_report_can_be_drawn_again(tmp_path: Path, capsys) -> None:
    src = tmp_path / "saved.json"
    src.write_text(json.dumps(_report()))
    main([str(src)])
    assert (tmp_path / "saved-latency-cdf.png").is_file()
    assert "saved-throughput.png" in capsys.readouterr().out

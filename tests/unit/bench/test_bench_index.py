"""mesh-bench index's pieces without a mesh: the corpus repeated with distinct ids, and the
tokens read from mesh-embed's own summary line."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from bench.harness.index import SUMMARY, LiveProbe, main, summary, write_corpus
from mesh.embed_cli.cli import _summary_line
from mesh.embed_cli.pipeline import Summary


def test_the_corpus_is_repeated_with_an_id_per_row(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    assert write_corpus(path, ["a", "b", "c"], 2) == 6
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["text"] for r in rows] == ["a", "b", "c"] * 2
    assert len({r["id"] for r in rows}) == 6


def test_the_tokens_are_read_from_mesh_embed_s_summary_line() -> None:
    line = _summary_line(Summary(rows=2500, skipped=0, tokens=1_234_567, seconds=12.5),
                         Path("out.npy"))  # fmt: skip
    match = SUMMARY.search(line)
    assert match is not None
    assert int(match.group(1).replace(",", "")) == 1_234_567


def test_an_unknown_way_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(main, ["--ways", "direct,carrier-pigeon"])
    assert result.exit_code == 2
    assert "carrier-pigeon" in result.output


def test_the_summary_sets_each_way_against_direct_and_live_against_idle() -> None:
    live = {"p50_ms": 10.0, "p99_ms": 30.0}
    report = {"live_idle": {"p50_ms": 5.0, "p99_ms": 9.0},
              "ways": {"direct": {"tokens_per_s": 1000.0, "live": live},
                       "batch": {"tokens_per_s": 1200.0, "live": live}}}  # fmt: skip
    assert summary(report) == {
        "live_ms": {"idle": [5.0, 9.0], "direct": [10.0, 30.0], "batch": [10.0, 30.0]},
        "batch_over_direct": 1.2,
    }


def test_live_percentiles_are_null_without_an_answered_query() -> None:
    probe = LiveProbe("http://127.0.0.1:9/v1", "m", ["q"], 4.0)
    assert probe.summary() == {"queries": 0, "failures": 0, "p50_ms": None, "p99_ms": None}
    probe.latencies_ms = [10.0, 20.0, 30.0]
    assert probe.summary()["p50_ms"] == 20.0

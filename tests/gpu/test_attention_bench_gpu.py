"""mesh-bench attention on the device: every existing backend on a small MiniLM-shaped and
MPNet-shaped batch is checked against exact SDPA and timed, and the report says so."""

from __future__ import annotations

import json

from bench.harness import attention


def test_the_attention_bench_checks_and_times_the_backends(tmp_path) -> None:
    out = tmp_path / "attention.json"
    code = attention.main(["--json", str(out), "--families", "minilm,mpnet-base",
                           "--tokens", "2048", "--warmup", "1", "--repeats", "2"])  # fmt: skip
    assert code == 0
    results = {(r["shape"], r["backend"]): r for r in json.loads(out.read_text())["results"]}
    varlen = results[("minilm", "varlen")]
    assert varlen["error"] is None and varlen["min_cos"] >= 0.999 and varlen["eager_ms"] > 0
    assert varlen["graph_ms"] is not None  # it replays in a graph
    grouped = results[("mpnet-base", "sdpa-grouped")]
    assert grouped["error"] is None and grouped["min_cos"] >= 0.999
    assert results[("mpnet-base", "varlen")]["error"] == "takes no bias"

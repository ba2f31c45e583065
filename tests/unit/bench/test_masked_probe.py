"""bench/masked_probe.py runs end to end in its CPU mode and records what the GPU call reads."""

from __future__ import annotations

import json
from pathlib import Path

from bench import masked_probe


def test_the_quick_probe_times_seen_and_fresh_batches(tmp_path: Path) -> None:
    masked_probe.main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "masked-probe.json").read_text())
    assert result["family"] == "mpnet" and result["masked_backend"] == "cpu"
    runs = result["runs"]["no-cudnn"]
    assert set(runs) == {"repeat", "fresh"}
    for run in runs.values():
        assert run["tok_s"] > 0 and run["ms_per_batch"] > 0


def test_fresh_draws_differ_and_stay_within_the_budget() -> None:
    ids = [masked_probe.np.arange(n, dtype=masked_probe.np.int32) for n in range(5, 400, 7)]
    first, second = masked_probe.draws(ids, 3, seed=1), masked_probe.draws(ids, 3, seed=2)
    assert len(first) == len(second) == 3
    assert all(int(offsets[-1]) <= masked_probe.BUDGET for _, offsets in first + second)
    assert [o.tolist() for _, o in first] != [o.tolist() for _, o in second]

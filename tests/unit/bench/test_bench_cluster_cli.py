"""bench/cluster.py: a sweep's rows (topology, then engine, then delay; no delay rows for a
topology without links), the table, and a topology error as a usage error."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from bench import topology
from bench.cluster import main, rows, table

EXAMPLES = Path(topology.__file__).parent / "topologies"


def test_a_sweep_has_a_row_per_topology_engine_and_delay() -> None:
    split = topology.load(EXAMPLES / "hop-split.toml")
    one = topology.load(EXAMPLES / "hop-one-host.toml")
    planned = rows([one, split], ("null", "real"), (2.0, 20.0))
    assert [label for label, _ in planned] == [
        "hop-one-host engine=null", "hop-one-host engine=real",
        "hop-split engine=null delay=2ms", "hop-split engine=null delay=20ms",
        "hop-split engine=real delay=2ms", "hop-split engine=real delay=20ms",
    ]  # fmt: skip
    last = planned[-1][1]
    assert last.delay_ms("worker", "broker") == 20.0
    assert {w.engine for h in last.hosts for w in h.workers} == {"real"}
    assert [label for label, _ in rows([split], (), ())] == ["hop-split"]


def test_the_table_has_a_line_per_row_and_lane() -> None:
    stats = {"tokens_per_s": 1234.4, "requests_per_s": 5.0, "latency_ms": {"p50": 3.0, "p99": 9.0},
             "errors": {}}  # fmt: skip
    out = table([{"config": "workers-2", "lanes": {"load": {"stats": stats}}}])
    assert out.splitlines()[1].split() == ["workers-2", "1234", "5.0", "3.0", "9.0", "none"]


def test_a_topology_that_cannot_run_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[hosts.a]\nbroker = {}\n")
    result = CliRunner().invoke(main, ["--topology", str(bad)])
    assert result.exit_code == 2
    assert "a topology needs a broker, a worker and an ingress" in result.output

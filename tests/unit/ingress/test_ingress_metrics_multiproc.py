"""Several ingress processes, one registry: any process's /metrics shows the sum of all of them.

prometheus_client picks its value store when it is imported, so each "ingress process" here is
a real subprocess with PROMETHEUS_MULTIPROC_DIR set, as the parent of --ingress-procs starts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

# One ingress process: counts N requests, holds N*100 outstanding tokens, optionally renders.
PROCESS = """
import os, sys
from types import SimpleNamespace
from mesh.ingress.metrics import IngressMetrics

n, render = int(sys.argv[1]), sys.argv[2] == "render"
broker = SimpleNamespace(endpoint="ipc://b", alive=False, outstanding_tokens=n * 100, stats=None,
                         failovers=0, heard_ago=lambda: None)
metrics = IngressMetrics(SimpleNamespace(brokers=[broker]))
for _ in range(n):
    metrics.requests.labels("/v1/embeddings", "200").inc()
    metrics.latency.labels("/v1/embeddings").observe(0.01)
metrics.publish()
print(os.getpid())
if render:
    sys.stdout.write(metrics.render().decode())
"""


def _ingress(metrics_dir: Path, n: int, render: bool = False) -> tuple[int, str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    out = subprocess.run(
        [sys.executable, "-c", PROCESS, str(n), "render" if render else "quiet"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    ).stdout
    pid, _, text = out.partition("\n")
    return int(pid), text


def _value(text: str, series: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(series + " ")]
    assert len(lines) == 1, (series, text)
    return float(lines[0].rsplit(" ", 1)[1])


def test_any_process_renders_the_sum_of_every_process_and_dead_ones_leave_only_gauges(
    tmp_path: Path,
) -> None:
    requests = 'embedmesh_ingress_requests_total{route="/v1/embeddings",status="200"}'
    latency = 'embedmesh_ingress_request_duration_seconds_count{route="/v1/embeddings"}'
    outstanding = 'embedmesh_broker_outstanding_tokens{broker="ipc://b"}'
    first, _ = _ingress(tmp_path, 3)
    second, _ = _ingress(tmp_path, 4)
    _, text = _ingress(tmp_path, 0, render=True)
    assert _value(text, requests) == 7.0
    assert _value(text, latency) == 7.0
    # The exited processes were not marked dead yet: their outstanding tokens still count.
    assert _value(text, outstanding) == 700.0

    mark_process_dead(first, str(tmp_path))
    _, text = _ingress(tmp_path, 0, render=True)
    assert _value(text, requests) == 7.0, "a dead process's requests stay counted"
    assert _value(text, outstanding) == 400.0, "a dead process's live gauge leaves the sum"
    assert second != first

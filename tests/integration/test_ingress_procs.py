"""``--ingress-procs 2``: two ingress processes serve one HTTP port (SO_REUSEPORT), each with its
own links to the broker, one /metrics registry across them, and the API key in no command line.

Which process answers is the kernel's choice per connection, so the tests open fresh
connections until /health (which names the answering pid) has shown both, then keep each of
those connections alive: every request on one connection reaches the same process.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.spawn import free_port
from tests.integration.conftest import Mesh
from tests.integration.launched import (
    MODEL,
    START_S,
    Launched,
    cmdline,
    descendants,
    environ,
    request,
    start,
    wait_gone,
)

KEY = "ingress-procs-secret-7f3a"
AUTH = {"Authorization": f"Bearer {KEY}"}
LINE = re.compile(
    r"^embedmesh serving all-MiniLM-L6-v2 at (http://127\.0\.0\.1:(\d+)/v1) "
    r"\(1 worker, 2 ingress processes, cpu\)$"
)
TEXTS = ["hello world", "Two processes, one port: the kernel picks one per connection."]
MAX_CONNECTIONS = 200  # fresh connections tried to meet both processes (odds of missing: 2^-199)


def connections_by_pid(port: int, want: int = 2) -> dict[int, http.client.HTTPConnection]:
    """Open connections until /health has named ``want`` distinct pids (or MAX_CONNECTIONS were
    tried); one connection kept per pid."""
    found: dict[int, http.client.HTTPConnection] = {}
    for _ in range(MAX_CONNECTIONS):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        _, body = request(conn, "GET", "/health")
        pid = json.loads(body)["pid"]
        if pid in found:
            conn.close()
        else:
            found[pid] = conn
        if len(found) == want:
            break
    return found


def counter(text: str, series: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(series + " ")]
    assert len(lines) == 1, f"{series} not in /metrics:\n{text[-2000:]}"
    return float(lines[0].rsplit(" ", 1)[1])


def ingress_children(parent: int) -> set[int]:
    return {pid for pid in descendants(parent) if "--role ingress" in cmdline(pid)}


@pytest.fixture
def two_ingress_mesh(tmp_path: Path) -> Iterator[Launched]:
    # The key comes from the environment, as the docs recommend: then no argv holds it.
    run = start(
        tmp_path,
        "--ingress-procs", "2", "--threads", "1", "--http-port", str(free_port()),
        env={"EMBEDMESH_API_KEY": KEY},
    )  # fmt: skip
    yield run
    run.kill()


def test_role_all_with_two_ingress_procs_serves_one_port_from_both_and_sums_their_metrics(
    two_ingress_mesh: Launched,
) -> None:
    run = two_ingress_mesh
    line = run.first_line(START_S)
    match = LINE.match(line)
    assert match, f"unexpected first line {line!r}\n{run.stderr.read_text()[-3000:]}"
    port = int(match.group(2))
    children = descendants(run.proc.pid)
    ingresses = ingress_children(run.proc.pid)
    assert len(ingresses) == 2

    conns = connections_by_pid(port)
    assert set(conns) == ingresses, "both ingress children answer, and only they"
    served = {pid: 2 + i for i, pid in enumerate(conns)}  # 2 requests on one, 3 on the other
    vectors: dict[int, np.ndarray] = {}
    for pid, conn in conns.items():
        status, _ = request(conn, "POST", "/v1/embeddings", {"model": MODEL, "input": TEXTS})
        assert status == 401, "both processes enforce the key they got by environment"
        for _ in range(served[pid]):
            status, body = request(
                conn, "POST", "/v1/embeddings", {"model": MODEL, "input": TEXTS}, AUTH
            )
            assert status == 200, body[:500]
            data = sorted(json.loads(body)["data"], key=lambda d: d["index"])
            vectors[pid] = np.array([d["embedding"] for d in data])
    first, second = vectors.values()
    assert first.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-4)
    np.testing.assert_allclose(first, second, atol=1e-5)

    # Either process's /metrics is the sum over both: 2 + 3 embeddings, 2 refusals.
    ok = 'embedmesh_ingress_requests_total{route="/v1/embeddings",status="200"}'
    refused = 'embedmesh_ingress_requests_total{route="/v1/embeddings",status="401"}'
    inputs = f'embedmesh_ingress_inputs_total{{model="{MODEL}"}}'
    for conn in conns.values():
        status, body = request(conn, "GET", "/metrics")
        text = body.decode()
        assert status == 200
        assert counter(text, ok) == sum(served.values())
        assert counter(text, refused) == 2
        assert counter(text, inputs) == len(TEXTS) * sum(served.values())
    for conn in conns.values():
        conn.close()

    # The key is in no command line (ps shows them to every user), only in the ingresses' env.
    assert KEY not in cmdline(run.proc.pid)
    for pid in children:
        assert KEY not in cmdline(pid), cmdline(pid)
        assert (environ(pid).get("EMBEDMESH_API_KEY") == KEY) == (pid in ingresses)
    metrics_dirs = {environ(pid)["PROMETHEUS_MULTIPROC_DIR"] for pid in ingresses}
    assert len(metrics_dirs) == 1 and Path(next(iter(metrics_dirs))).is_dir()

    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=30) == 0, run.stderr.read_text()[-4000:]
    assert not wait_gone(children), "children outlived the supervisor"
    assert not Path(next(iter(metrics_dirs))).exists(), "the metrics dir is removed at exit"


def test_role_ingress_with_two_procs_runs_two_children_on_one_port_keyed_by_file(
    mesh: Mesh, tmp_path: Path
) -> None:
    """A broker alone is enough: /health answers 503 (no worker yet), still naming its pid."""
    mesh.start_broker()
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    port = free_port()
    run = start(
        tmp_path,
        "--ingress-procs", "2", "--broker", mesh.frontend, "--http-port", str(port),
        "--api-key-file", str(key_file),
        role="ingress",
    )  # fmt: skip
    try:
        # Once the parent says the group is up: a child killed before is a failed start.
        line = run.first_line(START_S)
        assert line == f"embedmesh ingress serving at http://127.0.0.1:{port}/v1 (2 processes)"
        conns = _wait_for_pids(run, port)
        ingresses = ingress_children(run.proc.pid)
        assert set(conns) == ingresses and len(ingresses) == 2
        for conn in conns.values():
            assert request(conn, "GET", "/v1/models")[0] == 401
            assert request(conn, "GET", "/v1/models", headers=AUTH)[0] == 200
            conn.close()
        for pid in [run.proc.pid, *ingresses]:
            assert KEY not in cmdline(pid), cmdline(pid)

        # One child killed: the parent starts another; the dead one's counts stay in the sum,
        # its live gauge (outstanding tokens) leaves it.
        metrics_dir = Path(environ(min(ingresses))["PROMETHEUS_MULTIPROC_DIR"])
        dead = min(ingresses)
        assert (metrics_dir / f"gauge_livesum_{dead}.db").exists()
        os.kill(dead, signal.SIGKILL)
        conns = _wait_for_pids(run, port, exclude=dead)
        assert dead not in conns and len(set(conns) & ingresses) == 1
        assert not (metrics_dir / f"gauge_livesum_{dead}.db").exists()
        _, body = request(next(iter(conns.values())), "GET", "/metrics")
        refused = 'embedmesh_ingress_requests_total{route="/v1/models",status="401"}'
        assert counter(body.decode(), refused) == 2
        for conn in conns.values():
            conn.close()
        assert "restarting ingress-" in run.stderr.read_text()

        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=30) == 0, run.stderr.read_text()[-4000:]
        assert not wait_gone(ingresses | set(conns))
        assert not metrics_dir.exists()
    finally:
        run.kill()


def _wait_for_pids(
    run: Launched, port: int, exclude: int | None = None
) -> dict[int, http.client.HTTPConnection]:
    """Connections to both ingress children of ``run`` (none to ``exclude``, a killed one)."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, run.stderr.read_text()[-4000:]
        if len(ingress_children(run.proc.pid) - {exclude}) == 2:
            with contextlib.suppress(OSError, http.client.HTTPException):
                conns = connections_by_pid(port)
                if len(conns) == 2:
                    return conns
                for conn in conns.values():
                    conn.close()  # one is not listening yet
        time.sleep(0.2)
    pytest.fail(f"two ingress processes never answered\n{run.stderr.read_text()[-4000:]}")


def test_several_ingress_procs_refuse_a_port_someone_else_listens_on(tmp_path: Path) -> None:
    """Without the check, SO_REUSEPORT would let them join the other server's port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = start(tmp_path, "--ingress-procs", "2", "--http-port", str(port), role="ingress")
        try:
            assert run.proc.wait(timeout=60) == 1
        finally:
            run.kill()
    err = run.stderr.read_text()
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in err, err[-2000:]
    assert "ingress-0" not in err, "nothing was started"

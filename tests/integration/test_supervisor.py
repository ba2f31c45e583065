"""``mesh-launch --role all`` as a user runs it: a real supervisor over real role processes."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.spawn import free_port
from launch.options import LaunchArgs, WorkerArgs
from tests.integration.launched import (
    START_S,
    Launched,
    alive,
    cmdline,
    descendants,
    start,
)

LINE = re.compile(
    r"^embedmesh serving all-MiniLM-L6-v2 at (http://127\.0\.0\.1:\d+/v1) \(1 worker, cpu\)$"
)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Launched]:
    run = start(tmp_path, "--http-port", str(free_port()))
    yield run
    run.kill()


def _post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def test_role_all_prints_its_url_serves_embeddings_and_stops_cleanly_on_sigterm(
    launched: Launched,
) -> None:
    line = launched.first_line(START_S)
    match = LINE.match(line)
    assert match, f"unexpected first line {line!r}"
    base = match.group(1)
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=10) as resp:
        assert resp.status == 200

    texts = ["hello world", "ZeroMQ brokers route batches of token ids to workers."]
    body = _post_json(f"{base}/embeddings", {"model": "all-MiniLM-L6-v2", "input": texts})
    vectors = np.array([d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert body["usage"]["prompt_tokens"] > len(texts)

    children = descendants(launched.proc.pid)
    assert len(children) >= 3, "broker, worker and ingress should be running"
    launched.proc.send_signal(signal.SIGTERM)
    assert launched.proc.wait(timeout=30) == 0, launched.stderr.read_text()[-4000:]
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)], "children outlived the supervisor"


def test_the_url_line_waits_for_every_worker(tmp_path: Path) -> None:
    run = start(tmp_path, "--workers", "2", "--threads", "1", "--http-port", str(free_port()))
    try:
        line = run.first_line(START_S)
        assert line.endswith("(2 workers, cpu)"), line
        base = line.split(" at ")[1].split(" ")[0]
        with urllib.request.urlopen(f"{base}/models", timeout=10) as resp:
            models = json.loads(resp.read())["data"]
        assert [m["workers"] for m in models] == [2]
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=30) == 0
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def _embed(base: str, text: str) -> tuple[int, np.ndarray | None]:
    """POST one text; (status, its vector when 200)."""
    try:
        body = _post_json(f"{base}/embeddings", {"model": "all-MiniLM-L6-v2", "input": [text]})
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None
    return 200, np.array(body["data"][0]["embedding"])


def test_a_worker_killed_while_serving_is_restarted_and_the_service_comes_back(
    launched: Launched,
) -> None:
    match = LINE.match(launched.first_line(START_S)) or pytest.fail("no URL line")
    base = match.group(1)
    status, before = _embed(base, "kill -9 is part of the example")
    assert status == 200
    children = descendants(launched.proc.pid)
    workers = [pid for pid in children if "--role worker" in cmdline(pid)]
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)

    deadline = time.monotonic() + START_S
    status, after = 0, None
    while status != 200 and time.monotonic() < deadline:
        assert launched.proc.poll() is None, launched.stderr.read_text()[-3000:]
        status, after = _embed(base, "kill -9 is part of the example")
        if status != 200:
            # While no worker serves the model: 503, or 502 for a request the dead worker
            # held (the broker's call, not the supervisor's); never a 500 or a hang.
            assert status in (0, 502, 503), status
            time.sleep(0.5)
    assert status == 200, launched.stderr.read_text()[-3000:]
    np.testing.assert_allclose(after, before, atol=1e-5)
    new_workers = [p for p in descendants(launched.proc.pid) if "--role worker" in cmdline(p)]
    assert len(new_workers) == 1 and new_workers[0] != workers[0]
    err = launched.stderr.read_text()
    assert "embedmesh: the worker-0 process was killed by SIGKILL while serving" in err, err[-3000:]
    assert "embedmesh: restarting worker-0 in 1s (restart 1 of at most 5 in a row)" in err
    launched.proc.send_signal(signal.SIGTERM)
    assert launched.proc.wait(timeout=30) == 0, launched.stderr.read_text()[-3000:]


def test_with_restarts_off_a_worker_killed_while_serving_stops_the_mesh_naming_it(
    tmp_path: Path,
) -> None:
    run = start(tmp_path, "--restart-limit", "0", "--http-port", str(free_port()))
    try:
        LINE.match(run.first_line(START_S)) or pytest.fail("no URL line")
        children = descendants(run.proc.pid)
        workers = [pid for pid in children if "--role worker" in cmdline(pid)]
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        assert run.proc.wait(timeout=30) == 1
    finally:
        run.kill()
    err = run.stderr.read_text()
    assert "embedmesh: the worker-0 process was killed by SIGKILL while serving" in err, err[-3000:]
    assert "not restarting it (--restart-limit 0); stopping everything" in err
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)]


def test_a_crash_loop_is_restarted_with_backoff_then_given_up_loudly(monkeypatch, capfd) -> None:
    """A role that dies at once every time: restarted ``limit`` times, then RoleFailed."""
    from launch import supervisor

    monkeypatch.setattr(supervisor, "RESTART_BACKOFF_S", 0.05)
    # Past start-up already (the watcher's job), and dying at once: click refuses the role.
    children = supervisor.spawn({"worker-0": ["--role", "no-such-role"]}, lambda _: {**os.environ})
    pids = {children[0].proc.pid}
    stop = threading.Event()
    try:
        with pytest.raises(supervisor.RoleFailed, match="giving up on it after 2 restarts"):
            supervisor._watch(children, stop, limit=2, metrics_dir=None)
        pids.add(children[0].proc.pid)
    finally:
        supervisor.stop_all(children)
    assert len(pids) == 2, "the child in the list is the last restart, not the first process"
    err = capfd.readouterr().err
    assert err.count("embedmesh: restarting worker-0") == 2, err
    assert "(restart 2 of at most 2 in a row)" in err and "no-such-role" in err


def test_restart_delays_double_up_to_a_cap_and_stop_past_the_limit() -> None:
    from launch.supervisor import RESTART_BACKOFF_MAX_S, restart_delay

    assert [restart_delay(n, 10) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert restart_delay(10, 10) == RESTART_BACKOFF_MAX_S
    assert restart_delay(6, 5) is None and restart_delay(1, 0) is None


def test_role_all_with_a_model_dir_without_a_model_exits_non_zero_naming_the_worker(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    run = start(tmp_path, "--model", str(empty), "--http-port", str(free_port()))
    try:
        code = run.proc.wait(timeout=START_S)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    err = run.stderr.read_text()
    assert code != 0
    assert run.lines.empty(), "no URL line for a mesh that never served"
    headline = err[err.index("embedmesh: ") :].splitlines()[0]
    assert "worker-0" in headline and "during start-up" in headline, err[-3000:]
    assert "no config.json in" in headline, headline


def _opts(**over: object) -> LaunchArgs:
    """What launch.cli hands run_all with every option at its default, but ``over``."""
    from launch.cli import parse

    return parse([])[1].replaced(**over)


def test_role_commands_pass_options_to_the_role_that_uses_them() -> None:
    from launch.supervisor import role_commands

    cmds = role_commands(
        _opts(
            workers=2,
            threads=1,
            max_batch_tokens=4096,
            auto_truncate=True,
            http_port=9000,
            warmup_buckets="16,64",
            no_compile=True,
            kernels="fused",
            ingress_procs=1,
            api_key="k",
        ),
        "ipc:///t/front",
        "ipc:///t/back",
    )
    assert list(cmds) == ["broker", "worker-0", "worker-1", "ingress"]
    broker, worker, ingress = cmds["broker"], cmds["worker-1"], cmds["ingress"]
    assert broker[:6] == [
        "--role",
        "broker",
        "--frontend",
        "ipc:///t/front",
        "--backend",
        "ipc:///t/back",
    ]
    assert worker[2:4] == ["--broker", "ipc:///t/back"]
    assert "--threads" in worker and worker[worker.index("--threads") + 1] == "1"
    assert worker[worker.index("--max-batch-tokens") + 1] == "4096"
    assert "--auto-truncate" in ingress and "--auto-truncate" not in worker
    assert worker[worker.index("--warmup-buckets") + 1] == "16,64" and "--no-compile" in worker
    assert worker[worker.index("--kernels") + 1] == "fused" and "--kernels" not in ingress
    assert ingress[ingress.index("--http-port") + 1] == "9000"
    assert ingress[ingress.index("--broker") + 1] == "ipc:///t/front"
    assert all("--log-level" in c for c in cmds.values())
    assert "--reuse-port" not in ingress, "a lone ingress fails on a busy port instead of sharing"
    assert not any("k" in c for c in cmds.values()), "the API key travels by environment"


def test_worker_threads_split_the_cores_between_cpu_workers() -> None:
    from launch.supervisor import worker_threads

    cores = len(os.sched_getaffinity(0))
    assert worker_threads(_opts(workers=1)) == cores
    assert worker_threads(_opts(workers=cores * 2)) == 1
    assert worker_threads(_opts(workers=1, threads=3)) == 3
    assert worker_threads(_opts(workers=1, device="cuda")) is None


def test_kernels_and_no_compile_must_agree() -> None:
    from click.testing import CliRunner

    from launch.cli import main

    result = CliRunner().invoke(main, ["--role", "worker", "--kernels", "fused", "--no-compile"])
    assert result.exit_code == 2 and "--no-compile means --kernels torch" in result.output


def test_a_cpu_worker_ignores_cuda_kernel_choices(monkeypatch) -> None:
    import launch.roles as roles
    from mesh.config import Liveness

    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def fake_load(model_dir, **kw):  # noqa: ANN001, ANN003
        seen.update(kw)
        raise Stop

    monkeypatch.setattr("mesh.worker.engine.engine.Engine.load", fake_load)
    cfg = WorkerArgs(device="cpu", credits=2, max_batch_requests=64, threads=1, kernels="fused")
    with pytest.raises(Stop):
        roles.run_worker(cfg, ("ipc:///t/b",), Liveness(), roles.Security())
    assert seen["kernels"] is None


def test_drain_body_and_orphan_settings_reach_the_roles_that_use_them() -> None:
    from launch.supervisor import role_commands

    def value(args: list[str], flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args else None

    cmds = role_commands(
        _opts(drain_grace=45.0, body_timeout=7.0, ingress_procs=2), "ipc:///f", "ipc:///b"
    )
    for name in ("ingress-0", "ingress-1"):
        assert value(cmds[name], "--drain-grace") == "45.0"
        assert value(cmds[name], "--body-timeout") == "7.0"
    assert value(cmds["worker-0"], "--drain-grace") is None
    # --role all restarts dead workers: the broker holds their model's work for the request
    # timeout unless told otherwise.
    assert value(cmds["broker"], "--orphan-grace") == "120.0"
    cmds = role_commands(_opts(orphan_grace=2.5, request_timeout=30.0), "ipc:///f", "ipc:///b")
    assert value(cmds["broker"], "--orphan-grace") == "2.5"


def test_the_broker_scheduling_flags_reach_the_broker() -> None:
    from launch.supervisor import role_commands

    settings = dict(live_window=2.5, live_bulk_batches=0.5, live_bulk_ms=40.0, hang_timeout=12.0)
    settings["cpu_bulk_ms"] = 250.0
    cmds = role_commands(_opts(**settings, forget_model_after=90.0), "ipc:///f", "ipc:///b")
    broker = cmds["broker"]
    for flag, value in (
        ("--cpu-bulk-ms", "250.0"),
        ("--live-window", "2.5"),
        ("--live-bulk-batches", "0.5"),
        ("--live-bulk-ms", "40.0"),
        ("--hang-timeout", "12.0"),
        ("--forget-model-after", "90.0"),
    ):
        assert broker[broker.index(flag) + 1] == value
    assert "--live-window" not in cmds["worker-0"]


def test_mesh_launch_role_broker_hands_its_scheduling_flags_to_broker_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    import launch.cli
    from mesh.broker.server import BrokerOptions

    seen: dict[str, BrokerOptions] = {}

    class Captured:
        def __init__(self, front, back, options: BrokerOptions) -> None:  # noqa: ANN001
            seen["options"] = options

        def run(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr("mesh.broker.server.Broker", Captured)
    monkeypatch.setattr("launch.roles._on_signals", lambda stop: None)
    args = ["--role", "broker", "--frontend", "inproc://f", "--backend", "inproc://b"]
    args += ["--live-window", "2", "--live-bulk-batches", "0.5"]
    args += ["--hang-timeout", "7", "--forget-model-after", "60", "--live-bulk-ms", "50"]
    args += ["--cpu-bulk-ms", "0"]
    result = CliRunner().invoke(launch.cli.main, args)
    assert result.exit_code == 0, result.output
    options = seen["options"]
    assert (options.live_window_s, options.live_bulk_batches) == (2.0, 0.5)
    assert (options.hang_s, options.forget_model_s, options.live_bulk_ms) == (7.0, 60.0, 50.0)
    assert options.cpu_bulk_ms == 0.0
    bad = CliRunner().invoke(launch.cli.main, ["--role", "broker", "--live-bulk-batches", "0"])
    assert bad.exit_code != 0 and "--live-bulk-batches" in bad.output


def test_role_all_binds_the_frontend_given_and_prints_it_for_a_mesh_client(
    tmp_path: Path,
) -> None:
    import asyncio

    from mesh.client import MeshClient

    frontend = f"tcp://127.0.0.1:{free_port()}"
    run = start(tmp_path, "--frontend", frontend, "--http-port", str(free_port()))
    try:
        assert LINE.match(run.first_line(START_S)), "the URL line keeps its format"
        assert run.first_line(10) == f"embedmesh broker frontend (MeshClient): {frontend}"

        async def embed() -> tuple[int, ...]:
            async with MeshClient(frontend) as client:
                await client.wait_ready(30, "all-MiniLM-L6-v2")
                result = await client.embed(["a client beside the HTTP API"], "all-MiniLM-L6-v2")
                return result.embeddings.shape

        assert asyncio.run(embed()) == (1, 384)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=30) == 0
    finally:
        run.kill()


def test_role_all_on_a_busy_port_fails_at_once_naming_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flags in (["--http-port", str(port)],
                      ["--http-port", str(free_port()), "--backend", f"tcp://127.0.0.1:{port}"]):  # fmt: skip
            run = start(tmp_path, *flags)
            try:
                assert run.proc.wait(timeout=60) == 1
            finally:
                run.kill()
            assert run.lines.empty(), "nothing says serving"
            err = run.stderr.read_text().strip()
            assert err.startswith("embedmesh: cannot serve") and f":{port}" in err, err
            assert len(err.splitlines()) == 1, err

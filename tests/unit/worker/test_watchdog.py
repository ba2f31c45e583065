"""The worker's watchdog: a worker that holds batches and answers none for ``watchdog_s``
exits (EXIT_HUNG) for its supervisor to start a fresh one; an idle or a progressing one never."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import mesh.worker.server as server_mod
from mesh.config import Liveness
from mesh.worker.server import EXIT_HUNG
from proto_msgs import BatchResult, encode
from tests.unit.worker.worker_fakes import SumEngine, assign, next_reply, serving


class HangsOnSecond(SumEngine):
    """The first batch is answered; the second never finishes until released (a deadlocked
    device, as the live lane's stall left every thread in a synchronize)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        self.calls += 1
        if self.calls >= 2:
            self.release.wait(30)
        return super().embed(ids, offsets)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """os._exit as the watchdog calls it, recorded instead of ending the test run."""
    codes: list[int] = []
    monkeypatch.setattr(server_mod.os, "_exit", codes.append)
    return codes


# The fake broker sends no heartbeats: with the default test liveness the worker would give it
# up after 1.5 s and drop what it sent (a race with these tests' seconds of work on a slow host).
PATIENT = Liveness(interval_s=5.0)


def _wait_for(codes: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("stderr_broken", [False, True])
def test_a_worker_holding_a_batch_it_never_answers_exits_for_a_fresh_start(
    tmp_path, exits: list[int], monkeypatch: pytest.MonkeyPatch, stderr_broken: bool
) -> None:  # noqa: ANN001
    if stderr_broken:  # a daemon's closed stderr: the stacks cannot be written, it exits still

        def closed(*args: object, **kwargs: object) -> None:
            raise ValueError("I/O operation on closed file")

        monkeypatch.setattr(server_mod.faulthandler, "dump_traceback", closed)
    engine = HangsOnSecond()
    endpoint = f"ipc://{tmp_path}/b"
    with serving(engine, endpoint, 0.0, liveness=PATIENT, watchdog_s=0.5) as (router, ident, _):
        try:
            router.send_multipart([ident, *encode(assign(1))])
            assert isinstance(next_reply(router), BatchResult)
            time.sleep(1.0)  # idle longer than the bound: no exit
            assert exits == []
            router.send_multipart([ident, *encode(assign(2))])  # hangs in the engine
            _wait_for(exits, 10)
            assert exits and exits[0] == EXIT_HUNG
        finally:
            engine.release.set()  # let the compute thread go, so the worker stops cleanly


def test_a_slow_worker_that_keeps_answering_is_not_hung(tmp_path, exits: list[int]) -> None:  # noqa: ANN001
    class Slow(SumEngine):
        def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
            time.sleep(0.25)  # each batch well within the bound, the whole run past it
            return super().embed(ids, offsets)

    endpoint = f"ipc://{tmp_path}/b"
    # 2 s of work in all against a 1 s bound: the watchdog looks every 0.25 s, so it sees a
    # gap of up to 0.5 s between answers, with 0.5 s to spare for a loaded host's stalls.
    with serving(Slow(), endpoint, 0.0, liveness=PATIENT, watchdog_s=1.0) as (router, ident, _):
        for batch_id in range(1, 9):
            router.send_multipart([ident, *encode(assign(batch_id))])
        replies = [next_reply(router) for _ in range(8)]
    assert all(isinstance(r, BatchResult) for r in replies)
    assert exits == []


def test_the_launchers_watchdog_flag_reaches_the_worker() -> None:
    from launch.cli import parse
    from launch.supervisor import role_commands

    opts = parse(["--role", "all", "--watchdog-s", "45"])[1]
    worker = role_commands(opts, "ipc:///t/f", "ipc:///t/b")["worker-0"]
    assert worker[worker.index("--watchdog-s") + 1] == "45.0"
    opts = parse(["--role", "all"])[1]
    assert "--watchdog-s" not in role_commands(opts, "ipc:///t/f", "ipc:///t/b")["worker-0"]


def test_zero_turns_the_watchdog_off(
    tmp_path, exits: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    engine = HangsOnSecond()
    endpoint = f"ipc://{tmp_path}/b"
    started: list[object] = []
    real_thread = server_mod.threading.Thread

    def recording(*args: object, **kwargs: object) -> threading.Thread:
        started.append(kwargs.get("name"))
        return real_thread(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(server_mod.threading, "Thread", recording)
    with serving(engine, endpoint, 0.0, liveness=PATIENT, watchdog_s=0.0) as (router, ident, _):
        try:
            router.send_multipart([ident, *encode(assign(1))])
            next_reply(router)
            router.send_multipart([ident, *encode(assign(2))])
            time.sleep(1.5)
            assert exits == []
            # This server's threads, not the process's: another test's may still be stopping.
            assert started and "watchdog" not in started
        finally:
            engine.release.set()

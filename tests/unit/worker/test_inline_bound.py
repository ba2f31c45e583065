"""Which threads run a worker's forwards: an idle CUDA worker answers a small batch on its
link thread; a CPU worker runs every forward on its compute thread (torch's OpenMP keeps a
thread team per calling thread, and forwards on two threads slowed both), unless it was given
a live lane, which asks for forwards on other threads, or an explicit bound."""

from __future__ import annotations

import pytest
import torch
import zmq

from mesh.config import Liveness
from mesh.worker.server import (
    INLINE_MAX_MS,
    SWITCH_INTERVAL_S,
    WorkerOptions,
    WorkerServer,
    inline_max_ms_for,
    switch_interval_s,
)
from proto_msgs import ModelInfo, encode
from tests.envs import set_or_unset
from tests.unit.worker.worker_fakes import DIMS, SumEngine, assign, next_reply, serving


class _CudaLooking(SumEngine):
    device = torch.device("cuda")  # never used for a forward here: only the bound is read


@pytest.mark.parametrize(
    ("engine", "given", "want"),
    [
        (SumEngine(), None, 0.0),
        (_CudaLooking(), None, INLINE_MAX_MS),
        (SumEngine(), 4.0, 4.0),  # an explicit bound is kept
    ],
)
def test_a_workers_inline_bound_follows_its_engines_device(engine, given, want) -> None:  # noqa: ANN001
    ctx = zmq.Context()
    try:
        info = ModelInfo("m", [], DIMS, 4096, 1000, "mean", False, "0" * 64)
        options = WorkerOptions("w", 2, 4096, 64, "cpu", inline_max_ms=given)
        server = WorkerServer(ctx, engine, info, b"{}", "inproc://x", options, Liveness())
        assert server._inline_max_ms == want
    finally:
        ctx.destroy(linger=0)


def test_a_live_lane_on_cpu_keeps_the_bound() -> None:
    assert inline_max_ms_for("cpu", live_lane=True) == INLINE_MAX_MS
    assert inline_max_ms_for("cpu") == 0.0 and inline_max_ms_for("cuda") == INLINE_MAX_MS


class _Threads(SumEngine):
    def __init__(self) -> None:
        self.threads: list[str] = []

    def embed(self, ids, offsets):  # noqa: ANN001, ANN201
        import threading

        self.threads.append(threading.current_thread().name)
        return super().embed(ids, offsets)


def test_a_cpu_workers_forwards_all_run_on_its_compute_thread() -> None:
    engine = _Threads()
    with serving(engine, "inproc://inline-bound", inline_max_ms=None) as (router, identity, _):
        for batch_id in range(1, 6):  # idle each time: one at a time, each answered first
            router.send_multipart([identity, *encode(assign(batch_id))])
            assert next_reply(router).batch_id == batch_id
    # The compute loop's thread (serving runs it on a thread of its own), never the link's.
    assert len(engine.threads) == 5 and len(set(engine.threads)) == 1
    assert engine.threads[0] != "broker-link"


def test_with_a_bound_an_idle_cpu_worker_answers_on_its_link_thread() -> None:
    """The control: the same batches with a bound run on the link thread (so the test above
    would see it if the CPU default had one)."""
    engine = _Threads()
    with serving(engine, "inproc://inline-bound-2", inline_max_ms=1000.0) as (router, ident, _):
        for batch_id in range(1, 6):
            router.send_multipart([ident, *encode(assign(batch_id))])
            assert next_reply(router).batch_id == batch_id
    # The first small batch has no timing yet and takes the compute thread; the rest inline.
    assert engine.threads[1:] == ["broker-link"] * 4


@pytest.mark.parametrize(
    ("value", "want_s"),
    [(None, SWITCH_INTERVAL_S), ("", SWITCH_INTERVAL_S), ("200", 0.0002), ("50", 0.00005),
     ("5000", 0.005), ("20", SWITCH_INTERVAL_S), ("9000", SWITCH_INTERVAL_S),
     ("fast", SWITCH_INTERVAL_S)],
)  # fmt: skip
def test_the_gil_switch_interval_is_the_default_unless_a_sane_override_is_given(
    monkeypatch: pytest.MonkeyPatch, value: str | None, want_s: float
) -> None:
    set_or_unset(monkeypatch, "EMBEDMESH_WORKER_SWITCH_US", value)
    assert switch_interval_s() == pytest.approx(want_s)

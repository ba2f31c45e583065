"""The worker's live gate (mesh.worker.live_gate): while a live batch runs, the bulk threads
wait at their checkpoints (bounded), so the live batch's thread has the GIL to itself."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from mesh.worker.live_gate import LIVE_GATE_MS, LiveGate, live_gate_ms_from_env
from mesh.worker.server import INLINE_MAX_TOKENS
from proto_msgs import BatchResult, encode
from tests.envs import set_or_unset
from tests.unit.worker.worker_fakes import SumEngine, assign, next_reply, serving


def test_a_checkpoint_returns_at_once_when_no_live_batch_runs() -> None:
    gate = LiveGate(10_000)
    assert gate.yield_to_live() == 0.0 and gate.waits == 0


def test_a_checkpoint_waits_for_the_live_batch_to_end() -> None:
    gate = LiveGate(10_000)
    entered, leave = threading.Event(), threading.Event()

    def live() -> None:
        with gate.live():
            entered.set()
            leave.wait(10)

    runner = threading.Thread(target=live)
    runner.start()
    assert entered.wait(10)
    waited: list[float] = []
    bulk = threading.Thread(target=lambda: waited.append(gate.yield_to_live()))
    bulk.start()
    bulk.join(0.2)
    assert bulk.is_alive()  # still waiting: the live batch has not ended
    leave.set()
    bulk.join(10)
    runner.join(10)
    assert not bulk.is_alive() and waited[0] >= 0.2
    assert (gate.waits, gate.timeouts) == (1, 0)


def test_a_checkpoint_never_waits_longer_than_its_bound() -> None:
    gate = LiveGate(50)
    with gate.live():
        waited = gate.yield_to_live()
    assert 0.05 <= waited < 5.0 and (gate.waits, gate.timeouts) == (1, 1)
    assert "1 cut at 50 ms" in gate.summary()


def test_a_gate_turned_off_never_waits() -> None:
    gate = LiveGate(0)
    with gate.live():
        assert gate.yield_to_live() == 0.0
    assert not gate.enabled and gate.summary() == "live gate off"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, LIVE_GATE_MS),
        ("", LIVE_GATE_MS),
        ("0", 0.0),
        ("7.5", 7.5),
        ("20", 20.0),
        ("-1", LIVE_GATE_MS),
        ("21", LIVE_GATE_MS),
        ("soon", LIVE_GATE_MS),
    ],  # fmt: skip
)
def test_the_bound_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, want: float
) -> None:
    set_or_unset(monkeypatch, "EMBEDMESH_LIVE_GATE_MS", raw)
    assert live_gate_ms_from_env() == want


class _Timeline(SumEngine):
    """Records when each batch's forward starts and ends; its live-lane sibling takes
    ``lane_s`` a batch (slow enough that the lane's own thread runs it, not the link's)."""

    vocab_size = 1000

    def __init__(self, lane_s: float, events: list[tuple[str, str, float]] | None = None,
                 role: str = "bulk") -> None:  # fmt: skip
        self.lane_s, self.role = lane_s, role
        self.events = [] if events is None else events
        self.live_started = threading.Event()

    def live_lane(self, max_tokens: int) -> _Timeline:
        lane = _Timeline(self.lane_s, self.events, role="live")
        lane.live_started = self.live_started
        return lane

    def warmup(self, buckets: list[int]) -> None:
        pass

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        self.events.append((self.role, "start", time.perf_counter()))
        if self.role == "live":
            self.live_started.set()
            time.sleep(self.lane_s)
        out = super().embed(ids, offsets)
        self.events.append((self.role, "end", time.perf_counter()))
        return out


def _bulk_sent_during_a_live_batch(gate_ms: float, endpoint: str) -> list[tuple[str, str, float]]:
    """A live batch running on the lane's thread for 0.4 s, and a bulk batch arriving
    meanwhile, both answered: the engines' timeline."""
    engine = _Timeline(lane_s=0.4)
    # The lane's warm-up took 0.4 s, over the 100 ms inline bound: its batches run on its own
    # thread, so the link thread stays free to take the bulk batch meanwhile.
    with serving(engine, endpoint, 100.0, 3, live_lane=True) as (router, identity, server):
        server.gate = LiveGate(gate_ms)
        engine.live_started.clear()
        del engine.events[:]
        router.send_multipart([identity, *encode(assign(1))])
        assert engine.live_started.wait(10)
        router.send_multipart([identity, *encode(assign(2, INLINE_MAX_TOKENS + 1))])
        replies = [next_reply(router) for _ in range(2)]
    assert all(isinstance(r, BatchResult) for r in replies)
    assert sorted(r.batch_id for r in replies) == [1, 2]
    return engine.events


def test_a_bulk_batch_arriving_during_a_live_batch_launches_after_it() -> None:
    events = _bulk_sent_during_a_live_batch(10_000, "inproc://gate-1")
    live_end = next(t for role, what, t in events if (role, what) == ("live", "end"))
    bulk_start = next(t for role, what, t in events if (role, what) == ("bulk", "start"))
    # (Not the replies' order: the live reply leaves the lane thread for the link inside
    # the gate, but the link may forward the two in either order.)
    assert bulk_start >= live_end


def test_without_the_gate_the_bulk_batch_runs_beside_the_live_one() -> None:
    # The same scene with the gate off: what the gate changes.
    events = _bulk_sent_during_a_live_batch(0, "inproc://gate-2")
    live_end = next(t for role, what, t in events if (role, what) == ("live", "end"))
    bulk_start = next(t for role, what, t in events if (role, what) == ("bulk", "start"))
    assert bulk_start < live_end


class _Recording(LiveGate):
    """A gate that records which threads stop at its checkpoints, and which run live
    batches inside it."""

    def __init__(self) -> None:
        super().__init__(LIVE_GATE_MS)
        self.threads: list[str] = []
        self.live_threads: list[str] = []

    def yield_to_live(self) -> float:
        self.threads.append(threading.current_thread().name)
        return super().yield_to_live()

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        self.live_threads.append(threading.current_thread().name)
        with super().live():
            yield


def test_both_bulk_threads_stop_at_the_gate_and_the_live_ones_never_do() -> None:
    engine = _Timeline(lane_s=0.0)
    with serving(engine, "inproc://gate-3", 100.0, 3, live_lane=True) as (router, identity, server):
        gate = server.gate = _Recording()
        router.send_multipart([identity, *encode(assign(1, INLINE_MAX_TOKENS + 1))])  # bulk
        assert isinstance(next_reply(router), BatchResult)
        router.send_multipart([identity, *encode(assign(2))])  # a live query, on the lane
        assert isinstance(next_reply(router), BatchResult)
        assert server.stats.live == 1
    # Once each for the bulk batch: the compute thread before its launch, the finisher
    # before collecting it; the live query's thread never waits for itself.
    assert len(gate.threads) == 2 and gate.threads.count("finisher") == 1
    assert not {"broker-link", "live-lane"} & set(gate.threads)  # the other: the compute loop
    assert gate.live_threads == ["broker-link"]  # the query ran on the link thread, gated


def test_a_bad_bound_warns_and_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("EMBEDMESH_LIVE_GATE_MS", "soon")
    with caplog.at_level("WARNING", logger="embedmesh.worker"):
        assert live_gate_ms_from_env() == LIVE_GATE_MS
    assert "EMBEDMESH_LIVE_GATE_MS='soon' is not 0..20: using 3 ms" in caplog.text

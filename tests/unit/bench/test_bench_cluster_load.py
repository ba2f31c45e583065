"""bench/cluster_load.py: load processes started as a cluster starts them (``python -m
bench.cluster_load`` on a place), told their jobs in a line, started at one instant by the
coordinator; their results merged per lane as one window."""

from __future__ import annotations

import asyncio
import io

import pytest

from bench.cluster_hosts import Place, stop_all
from bench.cluster_load import (
    LoadProcess,
    coordinate,
    instructions,
    measured_from_json,
    measured_to_json,
    read_instructions,
)
from bench.load import Measured, Target
from bench.procs import Job, Timing, closed_jobs
from bench.stats import Sample
from bench.topology import Host

BODIES = [(b'{"model": "m", "input": "a"}', 1), (b'{"model": "m", "input": ["b", "c"]}', 2)]


def test_instructions_and_results_survive_their_lines() -> None:
    job = Job("bulk", BODIES, concurrency=3, count=7, first=1)
    line = instructions(Target("http://h:1/v1", "k", 9.0), BODIES, [job], Timing(4.0, 1.5))
    assert "\n" not in line
    target, jobs, timing = read_instructions(line)
    assert target == Target("http://h:1/v1", "k", 9.0) and timing == Timing(4.0, 1.5)
    assert jobs == [job]
    m = Measured([Sample(0.1, 0.02, "200", 2, 6), Sample(0.2, 0.5, "timeout", 1)], 0.0, 3.0)
    (back,) = measured_from_json(measured_to_json([m]))
    assert back == m


@pytest.mark.timeout(120)
async def test_load_processes_start_together_and_their_samples_merge(stub_target, tmp_path) -> None:  # noqa: ANN001
    stub, target = stub_target
    stub.delay_s = 0.02
    place = Place(Host("here", kind="local"), "127.0.0.1")
    loads = []
    for i, job in enumerate(closed_jobs("", BODIES, 4, 2, count=20)):
        started = place.start("load", "bench.cluster_load", [], tmp_path / f"{i}.log",
                              stdin_commands=True)  # fmt: skip
        lp = LoadProcess(f"here/{i}", started.proc.stdin, started.proc.stdout,
                         lambda s=started: s.proc.poll() is None, [job])  # fmt: skip
        lp.send(instructions(target, BODIES, [job], Timing(None)))
        loads.append(lp)
    seen: list[str] = []
    try:
        lanes = await asyncio.to_thread(
            coordinate,
            loads,
            Timing(None),
            lambda: seen.append("window"),
            lambda: seen.append("done"),
        )
        codes = [s.proc.wait(30) for s in place.started]  # each ends once it has reported
    finally:
        stop_all(place.started)
    merged = lanes[""]
    assert len(merged.samples) == 20 == stub.calls
    assert all(s.ok and s.tokens == 3 * s.texts for s in merged.samples)
    assert stub.peak == 4  # two processes of two clients each, at once
    assert seen == ["window", "done"]
    assert codes == [0, 0]


def test_a_load_process_that_ends_early_is_reported_not_awaited() -> None:
    lp = LoadProcess("gone", io.BytesIO(), io.BytesIO(b""), lambda: False, [])
    with pytest.raises(RuntimeError, match="gone ended early"):
        coordinate([lp], Timing(1.0))

"""Load processes on load hosts, one coordinator: ``mesh-bench cluster``'s load.

A load process (``python -m bench.cluster_load``, started on its host: in a namespace, over
ssh or here) talks to the coordinator in lines on its standard input and output:

1. in: its instructions as one JSON object: the target (``url``, ``api_key``, ``timeout_s``),
   the request ``bodies`` and its ``jobs`` (bench/procs.py's ``Job``), the window
   (``duration_s``, ``warmup_s``);
2. out: ``ready``;
3. in: the wall-clock instant every load process starts at (the coordinator picks it once all
   are ready: real hosts need clocks in step, e.g. NTP, for their windows to coincide);
4. out: what each job measured, as one JSON object, times from that instant; then it exits.

The jobs and the merge are bench/procs.py's, as ``mesh-bench http --procs N`` uses them on one
host: a load split into shares, the samples concatenated and the windows united per lane.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.load import Body, Measured, Target
from bench.procs import GO_MARGIN_S, READY_TIMEOUT_S, Job, Timing, merge_lanes, run_jobs
from bench.stats import Sample

RESULT_GRACE_S = 120.0  # past the window: the last requests' answers, the results' transfer


def instructions(target: Target, bodies: Sequence[Body], jobs: Sequence[Job],
                 timing: Timing) -> str:  # fmt: skip
    """The first line a load process reads."""
    shared = [[data.decode(), n] for data, n in bodies]
    plain = [{k: v for k, v in asdict(job).items() if k != "bodies"} for job in jobs]
    return json.dumps({
        "url": target.url, "api_key": target.api_key, "timeout_s": target.timeout_s,
        "bodies": shared, "jobs": plain,
        "duration_s": timing.duration_s, "warmup_s": timing.warmup_s,
    })  # fmt: skip


def read_instructions(line: str) -> tuple[Target, list[Job], Timing]:
    spec = json.loads(line)
    bodies = [(text.encode(), int(n)) for text, n in spec["bodies"]]
    jobs = [Job(bodies=bodies, **job) for job in spec["jobs"]]
    target = Target(spec["url"], spec.get("api_key"), float(spec["timeout_s"]))
    return target, jobs, Timing(spec["duration_s"], float(spec["warmup_s"]))


def measured_to_json(measured: Sequence[Measured]) -> str:
    return json.dumps([
        {"start_s": m.start_s, "elapsed_s": m.elapsed_s,
         "samples": [[s.start_s, s.latency_s, s.status, s.texts, s.tokens] for s in m.samples]}
        for m in measured
    ])  # fmt: skip


def measured_from_json(line: str) -> list[Measured]:
    return [
        Measured([Sample(*row) for row in m["samples"]], m["start_s"], m["elapsed_s"])
        for m in json.loads(line)
    ]


def agent(lines_in: Any = None, out: Any = None) -> int:
    """A load process: the protocol above on standard input and output."""
    from bench.procs import _loop_runner
    from launch.children import die_with_parent_from_env

    die_with_parent_from_env()
    lines_in = lines_in or sys.stdin
    out = out or sys.stdout
    target, jobs, timing = read_instructions(lines_in.readline())
    print("ready", file=out, flush=True)
    go = lines_in.readline().strip()
    if not go:
        return 1  # the coordinator gave up before the start
    origin = time.perf_counter() + (float(go) - time.time())

    async def at_go() -> list[Measured]:
        import asyncio

        await asyncio.sleep(max(0.0, origin - time.perf_counter()))
        return await run_jobs(target, jobs, timing, origin)

    print(measured_to_json(_loop_runner()(at_go())), file=out, flush=True)
    return 0


@dataclass
class LoadProcess:
    """A started load process as the coordinator holds it: its pipes and its jobs."""

    name: str
    stdin: Any
    stdout: Any
    alive: Callable[[], bool]
    jobs: Sequence[Job]

    def __post_init__(self) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name=f"read {self.name}").start()

    def _pump(self) -> None:
        for raw in self.stdout:
            self.lines.put(raw.decode() if isinstance(raw, bytes) else raw)
        self.lines.put(None)

    def send(self, line: str) -> None:
        self.stdin.write((line.rstrip("\n") + "\n").encode())
        self.stdin.flush()

    def expect(self, timeout_s: float) -> str:
        """Its next line; RuntimeError when it ended or stayed silent ``timeout_s``."""
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"load process {self.name}: nothing in {timeout_s:.0f}s") from None
        if line is None:
            raise RuntimeError(f"load process {self.name} ended early (see its log)")
        return line.strip()


def coordinate(
    loads: Sequence[LoadProcess],
    timing: Timing,
    on_window: Callable[[], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> dict[str, Measured]:
    """Start every load process at one instant; their results merged by lane.
    ``on_window``: when the measured window opens; ``on_done``: when every result is in."""
    for load in loads:
        if load.expect(READY_TIMEOUT_S) != "ready":
            raise RuntimeError(f"load process {load.name} did not say ready")
    go = time.time() + GO_MARGIN_S + 0.2 * len(loads)  # more processes, more time to tell
    for load in loads:
        load.send(repr(go))
    if on_window is not None:
        time.sleep(max(0.0, go + timing.warmup_s - time.time()))
        on_window()
    window = (timing.duration_s or 0.0) + timing.warmup_s
    results: list[tuple[str, Measured]] = []
    for load in loads:
        wait = max(1.0, go + window - time.time()) + RESULT_GRACE_S
        measured = measured_from_json(load.expect(wait))
        results += [(job.lane, m) for job, m in zip(load.jobs, measured, strict=True)]
    if on_done is not None:
        on_done()
    return merge_lanes(results)


if __name__ == "__main__":
    sys.exit(agent())

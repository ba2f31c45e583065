"""``--procs N``: run a load from N processes, each with its share, and merge what they saw.

One aiohttp event loop tops out at a few thousand requests a second (on the H200 host one load
process could not saturate six ingress processes), so the load is cut into jobs: a closed loop
of C clients becomes N closed loops of about C / N, an open loop of rate R becomes N of R / N
(differently seeded: independent Poisson streams add up to one of rate R). Every process
starts its jobs at one agreed instant, so their measured windows coincide; each sample's times
are reported from that instant, and the merge concatenates the samples and takes the union of
the windows, so a rate summed over processes is a rate over one common window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from bench.load import Body, Measured, OnWindow, Target, closed_loop, open_loop

# How far ahead of "now" the processes are told to start: enough for the go message to reach
# every one of them on a busy host, small next to any measured window.
GO_MARGIN_S = 0.3
READY_TIMEOUT_S = 120.0  # a child imports aiohttp and unpickles the bodies before it is ready


@dataclass(frozen=True)
class Job:
    """One load inside one process: a closed loop (``concurrency``) or an open loop (``rate``)."""

    lane: str  # what the merge groups by: "" for a single-lane mode, "bulk", "live", ...
    bodies: Sequence[Body]
    concurrency: int = 0
    rate: float = 0.0
    count: int | None = None  # requests measured; None: measured for the timing's duration
    seed: int = 0
    even: bool = False  # open loop: evenly spaced arrivals instead of Poisson
    first: int = 0  # index of the first body sent: processes do not send in lockstep
    # Ask the ingress for per-hop timings (Sample.hops). Only where someone reads them: the
    # header costs the ingress and the mesh work per request, which a bulk lane should not pay.
    timings: bool = False

    def __post_init__(self) -> None:
        if (self.concurrency > 0) == (self.rate > 0):
            raise ValueError("a job is a closed loop (concurrency) or an open loop (rate)")


@dataclass(frozen=True)
class Timing:
    duration_s: float | None  # None: every job has a count
    warmup_s: float = 0.0


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integer shares differing by at most one; empty shares dropped."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    base, extra = divmod(total, parts)
    return [share for i in range(parts) if (share := base + (i < extra)) > 0]


def closed_jobs(
    lane: str, bodies: Sequence[Body], concurrency: int, procs: int, count: int | None = None
) -> list[Job]:
    """A closed loop of ``concurrency`` clients (and ``count`` requests) over ``procs``."""
    shares = split(concurrency, procs)
    counts = _count_shares(count, len(shares))
    return [
        Job(lane, bodies, concurrency=c, count=n, first=i * len(bodies) // len(shares))
        for i, (c, n) in enumerate(zip(shares, counts, strict=True))
    ]


def open_jobs(
    lane: str,
    bodies: Sequence[Body],
    rate: float,
    procs: int,
    *,
    count: int | None = None,
    seed: int = 0,
    even: bool = False,
    timings: bool = False,
) -> list[Job]:
    """An open loop of ``rate`` per second (and ``count`` requests) over ``procs``; ``timings``:
    its requests ask for per-hop timings."""
    counts = _count_shares(count, procs)
    return [
        Job(
            lane, bodies, rate=rate / procs, count=n, seed=seed + 1000 * i, even=even,
            first=i * len(bodies) // procs, timings=timings,
        )
        for i, n in enumerate(counts)
    ]  # fmt: skip


def _count_shares(count: int | None, parts: int) -> list[int | None]:
    if count is None:
        return [None] * parts
    shares = split(count, parts)
    if len(shares) < parts:
        raise ValueError(f"{count} requests cannot be shared by {parts} processes")
    return list(shares)


def merge(parts: Sequence[Measured]) -> Measured:
    """One measurement from several taken on one clock: samples concatenated, the window the
    union of theirs (they coincide when the processes started together)."""
    if not parts:
        raise ValueError("nothing to merge")
    start = min(p.start_s for p in parts)
    end = max(p.end_s for p in parts)
    return Measured([s for p in parts for s in p.samples], start, end - start)


def merge_lanes(results: Sequence[tuple[str, Measured]]) -> dict[str, Measured]:
    """Merge per lane, lanes in the order they first appear."""
    lanes: dict[str, list[Measured]] = {}
    for lane, measured in results:
        lanes.setdefault(lane, []).append(measured)
    return {lane: merge(parts) for lane, parts in lanes.items()}


async def run_jobs(
    target: Target, jobs: Sequence[Job], timing: Timing, origin: float | None = None
) -> list[Measured]:
    """Every job at once on this event loop; times from ``origin`` (perf_counter; default:
    the moment they started)."""
    go = time.perf_counter() if origin is None else origin
    measured = await asyncio.gather(*(_one(target, job, timing) for job in jobs))
    return [_shift(m, go) for m in measured]


def _one(target: Target, job: Job, timing: Timing) -> Coroutine[Any, Any, Measured]:
    k = job.first % len(job.bodies) if job.bodies else 0
    bodies = [*job.bodies[k:], *job.bodies[:k]]
    amount = {"count": job.count} if job.count is not None else {"duration_s": timing.duration_s}
    common = {"warmup_s": timing.warmup_s, "timings": job.timings, **amount}
    if job.concurrency:
        return closed_loop(target, bodies, job.concurrency, **common)
    return open_loop(target, bodies, job.rate, seed=job.seed, even=job.even, **common)


def _shift(m: Measured, origin: float) -> Measured:
    samples = [dataclasses.replace(s, start_s=s.start_s - origin) for s in m.samples]
    return Measured(samples, m.start_s - origin, m.elapsed_s)


def run(
    target: Target,
    per_process: Sequence[Sequence[Job]],
    timing: Timing,
    on_window: OnWindow = None,
    *,
    spawn: bool = True,
    on_done: OnWindow = None,
) -> dict[str, Measured]:
    """Run each list of jobs in a process of its own (``spawn``), or all of them on this
    process's loop; ``on_window`` when the measured window opens, ``on_done`` when every job
    has finished (before the load processes exit, so that their CPU time can still be read);
    the results merged by lane."""
    if not spawn:
        jobs = [job for group in per_process for job in group]

        async def here() -> list[Measured]:
            if on_window is not None:
                asyncio.get_running_loop().call_later(timing.warmup_s, on_window)
            return await run_jobs(target, jobs, timing)

        measured = _loop_runner()(here())
        if on_done is not None:
            on_done()
        return merge_lanes([(job.lane, m) for job, m in zip(jobs, measured, strict=True)])
    return merge_lanes(_run_spawned(target, per_process, timing, on_window, on_done))


def _run_spawned(
    target: Target,
    per_process: Sequence[Sequence[Job]],
    timing: Timing,
    on_window: OnWindow,
    on_done: OnWindow,
) -> list[tuple[str, Measured]]:
    ctx = multiprocessing.get_context("spawn")
    children: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    try:
        for jobs in per_process:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(there, target, list(jobs), timing), daemon=True)
            proc.start()
            there.close()
            children.append((proc, here))
        for proc, conn in children:
            _expect(conn, proc, "ready", READY_TIMEOUT_S)
        # Wall-clock time travels; each child turns it into its own perf_counter instant.
        go = time.time() + GO_MARGIN_S
        for _, conn in children:
            conn.send(go)
        if on_window is not None:
            time.sleep(max(0.0, go + timing.warmup_s - time.time()))
            on_window()
        results: list[tuple[str, Measured]] = []
        for (proc, conn), jobs in zip(children, per_process, strict=True):
            measured = _expect(conn, proc, "done", None)
            results += [(job.lane, m) for job, m in zip(jobs, measured, strict=True)]
        if on_done is not None:
            on_done()
        for _, conn in children:
            conn.send("exit")  # each child waits for this, so it is alive for on_done
        return results
    finally:
        for proc, conn in children:
            conn.close()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def _expect(
    conn: Connection, proc: multiprocessing.process.BaseProcess, what: str, timeout: float | None
) -> Any:
    """The next message from a child, which must be ``(what, payload)``; its error raised."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"load process {proc.pid} exited with {proc.exitcode}")
        if deadline is not None and time.monotonic() > deadline:
            raise RuntimeError(f"load process {proc.pid} not {what} within {timeout:.0f}s")
    kind, payload = conn.recv()
    if kind == "error":
        raise RuntimeError(f"load process {proc.pid} failed:\n{payload}")
    if kind != what:
        raise RuntimeError(f"load process {proc.pid} said {kind!r}, expected {what!r}")
    return payload


def _child(conn: Connection, target: Target, jobs: list[Job], timing: Timing) -> None:
    """A load process: ready, wait for the go instant, run the jobs, send the results."""
    try:
        conn.send(("ready", None))
        go_wall = conn.recv()

        # Times count from the agreed instant, not from when this process got going: one
        # that starts late shows as a later window, and the merged window widens to match.
        origin = time.perf_counter() + (go_wall - time.time())

        async def at_go() -> list[Measured]:
            await asyncio.sleep(max(0.0, origin - time.perf_counter()))
            return await run_jobs(target, jobs, timing, origin)

        conn.send(("done", _loop_runner()(at_go())))
        conn.recv()  # stay alive (and countable) until the parent has read our CPU time
    except EOFError:
        pass  # the parent is gone: nothing to report to
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _loop_runner() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run

"""``mesh-bench fuzz``: at least N hostile frames against a live broker's two sockets.

    mesh-bench fuzz --frames 1000000 --out fuzz.json
    mesh-bench fuzz --frames 20000 --out /tmp/fuzz.json

Starts a broker (``--role broker`` on private ipc:// endpoints) and one real CPU worker
(``--role worker``, the embedded all-MiniLM-L6-v2), then one legitimate ``MeshClient`` (its own
process) that embeds the same four texts over and over and compares each answer with the
first. Meanwhile ``--sockets`` DEALERs, half on the frontend (where ingresses connect), half on
the backend (where workers connect), send what ``bench.harness.fuzz_frames`` makes: random bytes,
truncated and bit-flipped real messages of every class, wrong command bytes, huge declared
lengths, type-confused fields, and valid but hostile messages (fake workers that then answer
their batches wrongly, conflicting READYs, unknown error codes and batch ids). A frame here is
one ZeroMQ message (a frame list), as the broker's ``dropped_frames`` counts them; the parts
are counted too. Only messages zmq accepted are counted; the run stops at ``--frames``.

Passes when the broker and the worker are the processes started (same pids, alive), the
legitimate client saw no error and no changed vector, the broker dropped at least every frame
that our own decode refuses, and its log shows no handler failure. The JSON at ``--out``:
counts by kind, frames/s, the broker's counters, RSS of broker and worker before, during and
after. Exit 1 on any failure.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import orjson
import zmq

from bench.harness.fuzz_peers import ERRORS, OK, WRONG, Fuzzer, broker_stats, legit_main
from bench.harness.soak import percentiles
from bench.harness.watch import rss_kb
from launch.children import die_with_parent

MODEL = "all-MiniLM-L6-v2"
SAMPLE_EVERY_S = 5.0
# Messages between giving one peer a fresh identity: over 1 M frames, more peers than the
# broker keeps in its bounded set of peers already warned about (4096).
ROTATE_EVERY = 200
# Lines of the broker's log that mean a message got past validation and tripped a handler.
HANDLER_FAILURE_MARKS = ("after it failed", "Traceback")


def spawn_role(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "launch.cli", *args, "--log-level", "WARNING"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
        )


def judge(result: dict[str, Any]) -> list[str]:
    """Why a fuzz run failed; empty when it passed."""
    out = []
    for role in ("broker", "worker"):
        if not result["alive_at_end"][role]:
            out.append(f"the {role} died (exit {result['exit_codes'][role]})")
    legit = result["legit_client"]
    if legit["errors"] or legit["wrong"]:
        out.append(f"the legitimate client saw {legit['errors']} errors, {legit['wrong']} wrong")
    if not legit["ok"]:
        out.append("the legitimate client got no answer")
    if result["frames_sent"] < result["frames_asked"]:
        out.append(f"only {result['frames_sent']} of {result['frames_asked']} frames sent")
    before, after = result["broker_before"], result["broker_after"]
    if before is None or after is None:
        out.append("the broker did not answer a ping before or after")
    elif after["dropped_frames"] - before["dropped_frames"] < result["must_drop"]:
        out.append("the broker dropped fewer frames than are malformed: some were not received")
    if result["handler_failures"]:
        out.append(f"{len(result['handler_failures'])} handler failures in the broker log")
    if result["local_decode_bugs"]:
        out.append("decode raised something other than ProtocolError")
    return out


class Run:
    """The processes of one fuzz run and what is watched of them."""

    def __init__(self, tmp: Path, model: str) -> None:
        self.tmp, self.model = tmp, model
        self.front, self.back = f"ipc://{tmp}/front", f"ipc://{tmp}/back"
        self.broker = spawn_role(
            ["--role", "broker", "--frontend", self.front, "--backend", self.back],
            tmp / "broker.log",
        )
        self.worker = spawn_role(
            ["--role", "worker", "--broker", self.back, "--threads", "1"], tmp / "worker.log"
        )
        self.pids = {"broker": self.broker.pid, "worker": self.worker.pid}
        ctx = multiprocessing.get_context("spawn")
        self.counters = ctx.Array("q", 3, lock=False)
        self.events, self.ready, self.stop = ctx.Queue(), ctx.Event(), ctx.Event()
        self.client = ctx.Process(
            target=legit_main,
            args=(self.front, model, self.counters, self.events, self.ready, self.stop),
            daemon=True,
        )
        self.client.start()
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.reference: Any = None

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.5):
            self.drain()
            if not self.client.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the mesh did not come up:\n{self.logs()}")

    def drain(self) -> None:
        while True:
            try:
                kind, payload = self.events.get_nowait()
            except queue.Empty:
                return
            if kind == "error":
                self.errors.append(payload)
            elif kind == "latency":
                self.latencies.append(payload)
            else:
                self.reference = payload

    def rss(self) -> dict[str, int | None]:
        return {role: rss_kb(pid) for role, pid in self.pids.items()}

    def legit(self) -> dict[str, int]:
        return {"ok": self.counters[OK], "errors": self.counters[ERRORS], "wrong": self.counters[WRONG]}  # fmt: skip

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )

    def finish(self) -> dict[str, Any]:
        """Stop the client, then the roles; whether each was alive up to then."""
        self.stop.set()
        deadline = time.monotonic() + 60
        while self.client.is_alive() and time.monotonic() < deadline:
            self.drain()
            self.client.join(0.2)
        self.drain()
        alive = {"broker": self.broker.poll() is None, "worker": self.worker.poll() is None}
        for proc in (self.worker, self.broker):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.client.is_alive():
            self.client.kill()
        return {
            "alive_at_end": alive,
            "exit_codes": {"broker": self.broker.returncode, "worker": self.worker.returncode},
        }


def fuzz(run: Run, frames: int, sockets: int, seed: int, doc: dict[str, Any]) -> Fuzzer:
    """Send until ``frames`` messages were taken; sample every few seconds."""
    fuzzer = Fuzzer(run.front, run.back, run.model, sockets, seed)
    t0 = last = time.monotonic()
    next_rotate, rounds = ROTATE_EVERY, 0
    while fuzzer.counts.messages < frames:
        rounds += 1
        if fuzzer.send_round() == 0:
            time.sleep(0.001)  # every queue full: let the broker catch up
        if rounds % 16 == 0:
            fuzzer.read_replies()
        if fuzzer.counts.messages >= next_rotate:
            fuzzer.rotate()
            next_rotate += ROTATE_EVERY
        if (now := time.monotonic()) - last >= SAMPLE_EVERY_S:
            last = now
            run.drain()
            sample = {"t_s": round(now - t0, 1), "messages": fuzzer.counts.messages,
                      "rss_kb": run.rss(), "legit": run.legit()}  # fmt: skip
            doc["samples"].append(sample)
            print(orjson.dumps(sample).decode(), flush=True)
    doc["send_s"] = time.monotonic() - t0
    return fuzzer


def settle(ctx: zmq.Context, front: str, fuzzer: Fuzzer, timeout_s: float = 120.0) -> Any:
    """Until the broker's dropped count stops moving: everything sent has been read."""
    stats, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fuzzer.read_replies()
        now = broker_stats(ctx, front)
        if stats is not None and now is not None and now.dropped_frames == stats.dropped_frames:
            return now
        stats = now
        time.sleep(1.0)
    return stats


@click.command()
@click.option("--frames", type=int, default=1_000_000, show_default=True,
              help="Messages (frame lists) to send in all.")  # fmt: skip
@click.option("--sockets", type=int, default=8, show_default=True,
              help="Fuzzing DEALERs, half on each side of the broker.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Mutator's random seed.")
@click.option("--model", default=MODEL, show_default=True, help="The worker's served name.")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The JSON result.")
def main(frames: int, sockets: int, seed: int, model: str, out: str) -> None:
    """Fuzz a live broker's sockets; the figures go to --out."""
    doc: dict[str, Any] = {"command": sys.argv, "samples": []}
    with tempfile.TemporaryDirectory(prefix="embedmesh-fuzz-") as tmp:
        run = Run(Path(tmp), model)
        try:
            result = execute(run, frames, sockets, seed, doc)
        finally:
            result_end = run.finish()
        broker_log = (Path(tmp) / "broker.log").read_text(errors="replace")
    result.update(result_end)
    result["handler_failures"] = [
        line for line in broker_log.splitlines() if any(m in line for m in HANDLER_FAILURE_MARKS)
    ][:50]
    result["broker_log_lines"] = broker_log.count("\n")
    result["broker_log_head"] = broker_log[:3000]
    result["legit_client"] = {**run.legit(), "errors_seen": run.errors[:50],
                              "latency_ms": percentiles(run.latencies)}  # fmt: skip
    result["failures"] = judge(result)
    doc["result"] = result
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    for key in ("frames_sent", "parts_sent", "frames_per_s", "must_drop", "broker_before",
                "broker_after", "rss_kb", "legit_client", "alive_at_end", "failures"):  # fmt: skip
        print(f"{key}: {result[key]}")
    sys.exit(1 if result["failures"] else 0)


def execute(run: Run, frames: int, sockets: int, seed: int, doc: dict[str, Any]) -> dict[str, Any]:
    run.wait_ready()
    ctx = zmq.Context.instance()
    time.sleep(2.0)  # a few of the client's requests before the first hostile frame
    before, rss_before = broker_stats(ctx, run.front), run.rss()
    fuzzer = fuzz(run, frames, sockets, seed, doc)
    try:
        after = settle(ctx, run.front, fuzzer)
        time.sleep(3.0)  # the legitimate client's requests after the storm count too
        rss_after = run.rss()
    finally:
        fuzzer.close()
    c = fuzzer.counts
    peak = {role: max([s["rss_kb"][role] or 0 for s in doc["samples"]] + [rss_after[role] or 0])
            for role in run.pids}  # fmt: skip
    return {
        "frames_asked": frames,
        "frames_sent": c.messages,
        "parts_sent": c.frames,
        "bytes_sent": c.bytes,
        "send_s": round(doc["send_s"], 1),
        "frames_per_s": round(c.messages / doc["send_s"]),
        "by_kind": dict(c.by_kind),
        "by_side": dict(c.by_side),
        "must_drop": c.must_drop,
        "valid_sent_by_class": dict(c.decoded_as),
        "replies": dict(c.replies),
        "sockets_opened": c.sockets_opened,
        "local_decode_bugs": c.local_decode_bugs,
        "broker_before": None if before is None else before.__dict__,
        "broker_after": None if after is None else after.__dict__,
        "rss_kb": {"before": rss_before, "after": rss_after, "max": peak},
        "pids": run.pids,
        "reference_head": run.reference,
    }


if __name__ == "__main__":
    main()

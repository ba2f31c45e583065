"""What one ZeroMQ hop costs when the processes on either side were idle (issue 8's idle query).

An idle query crosses four ZeroMQ transits (ingress → broker → worker → broker → ingress), each
waking a sleeping process. This probe measures a bare DEALER/ROUTER round trip between two
Python processes over ``ipc://`` (what ``--role all`` uses), after a gap of idleness before each
round trip, with each side either blocking in ``recv`` or spinning on ``poll(0)``:

    python3 -m bench.wake_probe [--rounds 300] [--gaps 0,1,5,20] [--json OUT]

A round trip back to back against one after a 5-20 ms gap says how much of a hop is the wake;
spinning on one side says how much of that a busy-poll there can take back (the ZeroMQ I/O
threads still sleep in epoll: a spin in the application thread cannot wake them sooner).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from multiprocessing.synchronize import Event

import zmq

from bench import spinners


def _recv(sock: zmq.Socket, spin: bool) -> list[bytes]:
    if spin:
        while not sock.poll(0):
            pass
    return sock.recv_multipart()


def _echo(endpoint: str, spin: bool, ready: Event) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    while True:
        frames = _recv(sock, spin)
        if frames[-1] == b"stop":
            sock.send_multipart(frames)
            break
        sock.send_multipart(frames)
    sock.close(0)
    ctx.term()


def _measure(endpoint: str, rounds: int, gaps_s: list[float], spin: bool) -> list[list[float]]:
    """Round trips in µs, one list per gap; stops the echo process at the end."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    payload = b"x" * 256
    for _ in range(20):  # connect and warm the path
        sock.send(payload)
        _recv(sock, spin)
    runs: list[list[float]] = []
    for gap_s in gaps_s:
        out: list[float] = []
        for _ in range(rounds):
            if gap_s:
                time.sleep(gap_s)
            t0 = time.perf_counter()
            sock.send(payload)
            _recv(sock, spin)
            out.append((time.perf_counter() - t0) * 1e6)
        runs.append(out)
    sock.send(b"stop")
    _recv(sock, False)
    sock.close(0)
    ctx.term()
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--gaps", default="0,1,5,20", help="ms of idleness before each round trip")
    parser.add_argument("--json", default=None, help="write the results here too")
    parser.add_argument(
        "--block-only", action="store_true", help="only both sides blocking in recv (no spin rows)"
    )
    parser.add_argument(
        "--keep-awake",
        type=int,
        default=None,
        metavar="N",
        help="run N busy loops at SCHED_IDLE meanwhile (0: one per core; bench/spinners.py)",
    )
    args = parser.parse_args(argv)
    gaps = [float(g) for g in args.gaps.split(",")]
    results = []
    spins = (False,) if args.block_only else (False, True)
    with tempfile.TemporaryDirectory() as tmp, spinners.spinning(args.keep_awake):
        for server_spin in spins:
            for client_spin in spins:
                endpoint = f"ipc://{tmp}/probe-{int(server_spin)}{int(client_spin)}"
                ready = mp.Event()
                server = mp.Process(target=_echo, args=(endpoint, server_spin, ready), daemon=True)
                server.start()
                if not ready.wait(10):
                    raise SystemExit(f"the echo process did not bind {endpoint} in 10 s")
                runs = _measure(endpoint, args.rounds, [g / 1000 for g in gaps], client_spin)
                for gap, run in zip(gaps, runs, strict=True):
                    rtt = sorted(run)
                    row = {
                        "server": "spin" if server_spin else "block",
                        "client": "spin" if client_spin else "block",
                        "gap_ms": gap,
                        "keep_awake": args.keep_awake,
                        "p50_us": round(statistics.median(rtt), 1),
                        "p90_us": round(rtt[int(0.9 * (len(rtt) - 1))], 1),
                        "p99_us": round(rtt[int(0.99 * (len(rtt) - 1))], 1),
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
                server.join(10)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``mesh-launch --role all``: one whole mesh on this host, each role in its own process.

The supervisor starts a broker, ``--workers`` workers and ``--ingress-procs`` ingresses as
children (``python -m launch.cli --role ...``), joined by ``ipc://`` endpoints in a private temp
dir (loopback TCP where ipc is missing). It waits until ``GET /health`` answers 200, every
ingress process has answered it, and ``GET /v1/models`` counts every worker, prints one line
with the URL on stdout, then watches:

- SIGINT / SIGTERM: stop the children in order, each stage with SIGTERM, then SIGKILL after
  its wait: the ingresses first (each closes its listening socket, refuses what arrives later
  with 503 and finishes what it accepted within ``--drain-grace``; we wait that plus
  DRAIN_MARGIN_S), then the workers (each finishes the batches it holds and says Disconnect),
  then the broker; exit 0. A second signal meanwhile stops what still runs at once (SIGKILL);
- a child that exits on its own during start-up: name it, print the tail of its output, stop
  the rest and exit 1 (a mesh that never served has nothing to keep up);
- a child that exits on its own while serving: name it, print the tail of its output and
  start it again after a backoff (1 s doubling to 30 s) while the others keep serving (the
  broker requeues a dead worker's batches; /health is 503 while a model has no worker). After
  ``--restart-limit`` restarts in a row, each within a minute of its start, give up loudly:
  stop the rest and exit 1.

``mesh-launch --role ingress --ingress-procs N`` (N > 1) runs the same way over N ingress
children only (``run_ingress_group``): one spawner, one watcher, one shutdown for both.

Several ingress processes share the HTTP port through SO_REUSEPORT and one metrics registry
through prometheus_client's multiprocess mode: a private directory in our temp dir, handed to
them as ``PROMETHEUS_MULTIPROC_DIR`` and removed with it (see ``mesh/ingress/metrics.py``).
Secrets never travel in argv (any user can read a command line): the API key reaches the
ingress children through their environment, and no other child gets it.

Starting, watching the output of and stopping a child: ``launch/children.py``; the start-up
probes: ``launch/readiness.py``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from threading import Event
from typing import Any

import zmq

from launch.children import (  # die_with_parent*: re-exported for cli and bench
    POLL_S,
    Child,
    RoleFailed,
    die_with_parent,
    die_with_parent_from_env,
    how_it_ended,
    spawn,
    start_child,
    start_pump,
    stop_all,
)
from launch.ingress_role import API_KEY_ENV, DEFAULT_BROKER, SECRET_ENV, api_key, ingress_procs
from launch.readiness import wait_listening, wait_ready
from mesh.config import DEFAULT_REQUEST_TIMEOUT_S
from mesh.ingress.config import DRAIN_GRACE_S

__all__ = [
    "RoleFailed",
    "check_port_free",
    "child_env",
    "die_with_parent",
    "die_with_parent_from_env",
    "ingress_commands",
    "restart_delay",
    "role_commands",
    "run_all",
    "run_ingress_group",
    "spawn",
    "worker_threads",
]

# A role that dies while serving is restarted after RESTART_BACKOFF_S, doubling up to
# RESTART_BACKOFF_MAX_S; a run of STABLE_RUN_S resets its count. --restart-limit restarts in a
# row (default 5; 3..10 is reasonable) and the supervisor gives up: a crash loop is a bug or a
# broken host, and a service manager above us is better placed to act on it.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_RUN_S = 60.0
RESTART_LIMIT = 5
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # mesh.ingress.metrics.MULTIPROC_ENV


def run_all(opts: dict[str, Any]) -> int:
    """Run a whole mesh until a signal (exit 0) or a role's failure (exit 1)."""

    def start(tmp: Path, metrics_dir: Path | None, children: list[Child], stop: Event) -> None:
        frontend, backend = _endpoints(tmp)
        commands = role_commands(opts, frontend, backend)
        children += spawn(commands, lambda name: child_env(opts, name, metrics_dir))
        url, model = asyncio.run(wait_ready(opts, children, stop))
        if not stop.is_set():
            print(f"embedmesh serving {model} at {url} ({_sizes(opts)})", flush=True)

    return _supervise(opts, "embedmesh-", start)


def run_ingress_group(opts: dict[str, Any]) -> int:
    """``--role ingress --ingress-procs N``: N ingress children on one port until a signal
    (forwarded to them; exit 0), a child's failure to start, or a crash loop (exit 1)."""
    # Key paths travel by environment too; the children link to the brokers as we would.
    extra = {"EMBEDMESH_CURVE_DIR": str(opts["curve_dir"])} if opts.get("curve_dir") else {}
    brokers = list(opts.get("broker_endpoints") or ()) or [DEFAULT_BROKER]
    commands = {
        name: [*args, *_common(opts)] for name, args in ingress_commands(opts, brokers).items()
    }

    def start(tmp: Path, metrics_dir: Path | None, children: list[Child], stop: Event) -> None:
        children += spawn(commands, lambda name: {**child_env(opts, name, metrics_dir), **extra})
        url = asyncio.run(wait_listening(opts, children, stop))
        if not stop.is_set():
            # As --role all does: the line says the group is up (a child that dies before it
            # fails the start; after it, the child is restarted).
            procs = ingress_procs(opts)
            print(f"embedmesh ingress serving at {url} ({procs} processes)", flush=True)

    return _supervise(opts, "embedmesh-ingress-", start)


def _supervise(
    opts: dict[str, Any],
    prefix: str,
    start: Callable[[Path, Path | None, list[Child], Event], None],
) -> int:
    """Check the HTTP port, ``start`` the children (into the list, so that whatever started is
    stopped whatever happens next) and wait until they are up, then watch them until a signal
    (exit 0) or a failure (exit 1). Our temp dir (ipc endpoints, shared metrics) goes at exit."""
    stop, hurry = _stop_on_signals()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    children: list[Child] = []
    try:
        check_port_free(str(opts["http_host"]), int(opts["http_port"]))
        metrics_dir = _metrics_dir(tmp, opts)
        start(tmp, metrics_dir, children, stop)
        _watch(children, stop, _restart_limit(opts), metrics_dir)
        return 0
    except RoleFailed as exc:
        print(f"embedmesh: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if stop.is_set() and children:
            print(
                f"embedmesh: stopping: requests in flight get up to {_drain_grace(opts):g}s "
                "(--drain-grace); a second Ctrl-C or SIGTERM stops at once",
                file=sys.stderr,
                flush=True,
            )
        stop_all(children, _drain_grace(opts), hurry)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_on_signals() -> tuple[Event, Event]:
    """(stop, hurry): the first SIGINT or SIGTERM sets ``stop`` (drain, then stop in order);
    a second sets ``hurry`` too: whoever presses Ctrl-C twice means now."""
    stop, hurry = Event(), Event()

    def on_signal(*_: object) -> None:
        if stop.is_set():
            hurry.set()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    return stop, hurry


def _drain_grace(opts: dict[str, Any]) -> float:
    grace = opts.get("drain_grace")
    return DRAIN_GRACE_S if grace is None else float(grace)


def _restart_limit(opts: dict[str, Any]) -> int:
    limit = opts.get("restart_limit")
    return RESTART_LIMIT if limit is None else int(limit)


def restart_delay(restarts_in_a_row: int, limit: int) -> float | None:
    """Seconds to wait before restart number ``restarts_in_a_row`` (1, 2, ...) of a role; None
    once past ``limit``: give up."""
    if restarts_in_a_row > limit:
        return None
    return min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (restarts_in_a_row - 1))


def _watch(children: list[Child], stop: Event, limit: int, metrics_dir: Path | None) -> None:
    """Until ``stop``: restart a child that exits on its own, in place in ``children`` (the
    others keep serving meanwhile), after a backoff; raise RoleFailed past ``limit``."""
    due: dict[str, float] = {}  # name of a dead child -> when to start it again
    while not stop.wait(POLL_S):
        now = time.monotonic()
        for i, child in enumerate(children):
            if child.name in due:
                if now >= due[child.name]:
                    del due[child.name]
                    children[i] = _respawn(child)
                continue
            code = child.proc.poll()
            if code is not None:
                _forget_metrics(child, metrics_dir)
                due[child.name] = now + _plan_restart(child, code, limit)


def _plan_restart(child: Child, code: int, limit: int) -> float:
    """Say loudly that ``child`` died and when it restarts; its delay, or RoleFailed."""
    if child.pump is not None:
        child.pump.join(timeout=2)  # let the last lines in
    ran_s = time.monotonic() - child.started
    child.restarts = 1 if ran_s >= STABLE_RUN_S else child.restarts + 1
    delay = restart_delay(child.restarts, limit)
    died = f"the {child.name} process {how_it_ended(code)} while serving: {child.last_line()}"
    if delay is None:
        why = (
            "not restarting it (--restart-limit 0)"
            if limit == 0
            else f"giving up on it after {limit} restarts in a row, each dead within "
            f"{STABLE_RUN_S:.0f}s (--restart-limit {limit})"
        )
        raise RoleFailed(
            f"{died}\nLast lines of its output:\n{child.tail_text()}\n"
            f"embedmesh: {why}; stopping everything."
        )
    print(
        f"embedmesh: {died}\nLast lines of its output:\n{child.tail_text()}\n"
        f"embedmesh: restarting {child.name} in {delay:.0f}s (restart {child.restarts} of at "
        f"most {limit} in a row); the other roles keep serving",
        file=sys.stderr,
        flush=True,
    )
    return delay


def _respawn(dead: Child) -> Child:
    child = start_child(dead.name, dead.args, dead.env)
    child.restarts = dead.restarts
    start_pump(child)
    print(f"embedmesh: restarted {child.name} (pid {child.proc.pid})", file=sys.stderr, flush=True)
    return child


def _forget_metrics(child: Child, metrics_dir: Path | None) -> None:
    """A dead ingress's live gauges leave the shared registry (its counters stay summed)."""
    if metrics_dir is not None and child.name.startswith("ingress"):
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(child.proc.pid, str(metrics_dir))


def _sizes(opts: dict[str, Any]) -> str:
    """'1 worker, cpu', or with several ingress processes '2 workers, 4 ingress processes, cpu'."""
    workers, procs = int(opts["workers"]), ingress_procs(opts)
    parts = [f"{workers} worker{'' if workers == 1 else 's'}"]
    if procs > 1:
        parts.append(f"{procs} ingress processes")
    return ", ".join([*parts, _device(opts)])


# ---- building the children ------------------------------------------------------------------


def _endpoints(tmp: Path) -> tuple[str, str]:
    """Broker frontend and backend: ipc in our temp dir, else two free loopback ports."""
    if zmq.has("ipc"):
        return f"ipc://{tmp}/front", f"ipc://{tmp}/back"
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"


def check_port_free(host: str, port: int) -> None:
    """Refuse a busy HTTP port before starting anything. Ingress processes bound with
    SO_REUSEPORT would otherwise join whatever already listens there (another mesh of the same
    user) and split its traffic instead of failing; a lone ingress would fail only after the
    rest of the mesh came up. A probe without SO_REUSEPORT fails on any listener."""
    if port == 0:
        # Each process would get a port of its own, and we could not find them to probe.
        raise RoleFailed("--http-port 0 cannot work here: the processes share one port; give one")
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise RoleFailed(f"cannot serve HTTP on {host}:{port}: {exc}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # As the server binds: TIME_WAIT connections of an earlier run do not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise RoleFailed(
                    f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc} "
                    "(is another server using the port? choose one with --http-port)"
                ) from None


def _metrics_dir(tmp: Path, opts: dict[str, Any]) -> Path | None:
    """The metrics directory the ingress processes share, when there are several."""
    if ingress_procs(opts) == 1:
        return None
    path = tmp / "metrics"
    path.mkdir(mode=0o700)
    return path


def child_env(opts: dict[str, Any], name: str, metrics_dir: Path | None) -> dict[str, str]:
    """A child's environment: ours, unbuffered; the API key for ingress children only, in
    EMBEDMESH_API_KEY (their click reads it), never in argv."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if name.startswith("ingress"):
        if (key := api_key(opts)) is not None:
            env[API_KEY_ENV] = key
        if metrics_dir is not None:
            env[MULTIPROC_ENV] = str(metrics_dir)
    return env


def _flags(opts: dict[str, Any], *names: str) -> list[str]:
    """``--name value`` for each option that is set (``--name`` alone for a true flag)."""
    out: list[str] = []
    for name in names:
        value = opts.get(name)
        if value is None or value is False or value == "":
            continue
        flag = "--" + name.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def _common(opts: dict[str, Any]) -> list[str]:
    return _flags(opts, "heartbeat_interval", "heartbeat_liveness", "log_level")


def worker_threads(opts: dict[str, Any]) -> int | None:
    """torch threads per worker: as given, else on CPU the cores split evenly between workers."""
    if opts.get("threads") is not None:
        return int(opts["threads"])
    if _device(opts) != "cpu":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, int(opts["workers"])))


def _device(opts: dict[str, Any]) -> str:
    return f"cuda:{opts['gpu']}" if opts.get("gpu") is not None else str(opts["device"])


def role_commands(opts: dict[str, Any], frontend: str, backend: str) -> dict[str, list[str]]:
    """The ``launch.cli`` arguments of every child, by child name."""
    broker = [
        "--role",
        "broker",
        "--frontend",
        frontend,
        "--backend",
        backend,
        *_flags(
            opts,
            "max_queued_tokens",
            "batch_timeout",
            "max_attempts",
            "aging",
            "live_window",
            "live_bulk_batches",
            "live_bulk_ms",
            "hang_timeout",
            "forget_model_after",
        ),
        "--orphan-grace",
        str(_orphan_grace(opts)),
    ]
    commands = {"broker": broker}
    workers = int(opts["workers"])
    if workers < 1:
        raise RoleFailed(f"--workers must be at least 1, not {workers}")
    threads = worker_threads(opts)
    for i in range(workers):
        device = ["--device", _device(opts)]
        if opts.get("device") == "cuda" and opts.get("gpu") is None and workers > 1:
            device = ["--gpu", str(i)]  # one GPU per worker
        commands[f"worker-{i}"] = [
            "--role",
            "worker",
            "--broker",
            backend,
            *device,
            *_flags(
                opts,
                "model",
                "served_name",
                "dtype",
                "credits",
                "live_lane",
                "max_batch_tokens",
                "max_batch_requests",
                "warmup_buckets",
                "kernels",
                "exact_gelu",
                "no_compile",
                "watchdog_s",
            ),
            *(["--threads", str(threads)] if threads is not None else []),
        ]
    commands.update(ingress_commands(opts, [frontend]))
    return {name: [*args, *_common(opts)] for name, args in commands.items()}


def _orphan_grace(opts: dict[str, Any]) -> float:
    """How long the broker holds the queued work of a model whose workers all died: as given,
    else the request timeout. We restart a dead worker, and a restart with a model load takes
    longer than the broker's own default (one heartbeat expiry), which would fail with 503
    work that the restarted worker could still finish within its deadline."""
    if opts.get("orphan_grace") is not None:
        return float(opts["orphan_grace"])
    return float(opts.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT_S)


def ingress_commands(opts: dict[str, Any], brokers: list[str]) -> dict[str, list[str]]:
    """The ``launch.cli`` arguments of each ingress child: ``ingress`` alone, or ``ingress-0``
    ... sharing the port. The API key is not among them (see ``child_env``)."""
    procs = ingress_procs(opts)
    args = [
        "--role",
        "ingress",
        *[arg for broker in brokers for arg in ("--broker", broker)],
        # Explicit, so that an inherited EMBEDMESH_INGRESS_PROCS cannot make a child a parent.
        "--ingress-procs",
        "1",
        *(["--reuse-port"] if procs > 1 else []),
        *_flags(
            opts,
            "http_host",
            "http_port",
            "auto_truncate",
            "tei_model",
            "max_body_bytes",
            "max_inputs",
            "tokenizer_threads",
            "tokenize_processes",
            "ingress_nice",
            "request_timeout",
            "drain_grace",
            "body_timeout",
            "insecure",
        ),
    ]
    if procs == 1:
        return {"ingress": args}
    return {f"ingress-{i}": list(args) for i in range(procs)}

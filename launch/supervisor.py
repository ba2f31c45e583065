"""``mesh-launch --role all``: one whole mesh on this host, each role in its own process.

The supervisor starts a broker, ``--workers`` workers and ``--ingress-procs`` ingresses as
children (``python -m launch.cli --role ...``, each argv built from the options object by
``launch.child_args``), joined by the ``--frontend`` and ``--backend`` given, else by ``ipc://``
endpoints in a private temp dir (loopback TCP where ipc is missing). It waits until
``GET /health`` answers 200, every ingress process has answered it, and ``GET /v1/models``
counts every worker, prints one line with the URL on stdout and one with the broker's frontend
(where a ``MeshClient`` connects), then watches:

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
import time
from collections.abc import Callable
from pathlib import Path
from threading import Event

import zmq

from launch.child_args import child_argv
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
from launch.ingress_role import API_KEY_ENV, SECRET_ENV, api_key
from launch.options import LaunchArgs, ingress_procs
from launch.ports import check_endpoint_free, check_port_free
from launch.readiness import wait_listening, wait_ready
from launch.tmpdirs import private_dir

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
# row (launch.options.RESTART_LIMIT) and the supervisor gives up: a crash loop is a bug or a
# broken host, and a service manager above us is better placed to act on it.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_RUN_S = 60.0
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # mesh.ingress.metrics.MULTIPROC_ENV


def run_all(args: LaunchArgs) -> int:
    """Run a whole mesh until a signal (exit 0) or a role's failure (exit 1)."""

    def start(tmp: Path, metrics_dir: Path | None, children: list[Child], stop: Event) -> None:
        for given, flag in (
            (args.broker.frontend, "--frontend"),
            (args.broker.backend, "--backend"),
        ):
            check_endpoint_free(given or "", flag)  # the broker binds there: fail before it
        frontend, backend = _endpoints(tmp, args)
        commands = role_commands(args, frontend, backend)
        children += spawn(commands, lambda name: child_env(args, name, metrics_dir))
        url, model = asyncio.run(wait_ready(args, children, stop))
        if not stop.is_set():
            print(f"embedmesh serving {model} at {url} ({_sizes(args)})", flush=True)
            print(f"embedmesh broker frontend (MeshClient): {frontend}", flush=True)

    return _supervise(args, "", start)


def run_ingress_group(args: LaunchArgs) -> int:
    """``--role ingress --ingress-procs N``: N ingress children on one port until a signal
    (forwarded to them; exit 0), a child's failure to start, or a crash loop (exit 1)."""
    commands = ingress_commands(args, list(args.link.broker_endpoints))

    def start(tmp: Path, metrics_dir: Path | None, children: list[Child], stop: Event) -> None:
        children += spawn(commands, lambda name: child_env(args, name, metrics_dir))
        url = asyncio.run(wait_listening(args, children, stop))
        if not stop.is_set():
            # As --role all does: the line says the group is up (a child that dies before it
            # fails the start; after it, the child is restarted).
            procs = ingress_procs(args)
            print(f"embedmesh ingress serving at {url} ({procs} processes)", flush=True)

    return _supervise(args, "ingress", start)


def _supervise(
    args: LaunchArgs,
    kind: str,
    start: Callable[[Path, Path | None, list[Child], Event], None],
) -> int:
    """Check the ports, ``start`` the children (into the list, so that whatever started is
    stopped whatever happens next) and wait until they are up, then watch them until a signal
    (exit 0) or a failure (exit 1). Our temp dir (ipc endpoints, shared metrics; named after
    ``kind`` and our pid, ``launch.tmpdirs``) goes at exit; those of launchers killed before
    they could remove theirs go at our start."""
    stop, hurry = _stop_on_signals()
    tmp = private_dir(kind)
    children: list[Child] = []
    grace = args.ingress.drain_grace
    try:
        check_port_free(args.ingress.http_host, args.ingress.http_port)
        metrics_dir = _metrics_dir(tmp, args)
        start(tmp, metrics_dir, children, stop)
        _watch(children, stop, args.supervisor.restart_limit, metrics_dir)
        return 0
    except RoleFailed as exc:
        print(f"embedmesh: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if stop.is_set() and children:
            print(
                f"embedmesh: stopping: requests in flight get up to {grace:g}s "
                "(--drain-grace); a second Ctrl-C or SIGTERM stops at once",
                file=sys.stderr,
                flush=True,
            )
        stop_all(children, grace, hurry)
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


def _sizes(args: LaunchArgs) -> str:
    """'1 worker, cpu', or with several ingress processes '2 workers, 4 ingress processes, cpu'."""
    workers, procs = args.supervisor.workers, ingress_procs(args)
    parts = [f"{workers} worker{'' if workers == 1 else 's'}"]
    if procs > 1:
        parts.append(f"{procs} ingress processes")
    return ", ".join([*parts, args.worker.device_name])


# ---- building the children ------------------------------------------------------------------


def _endpoints(tmp: Path, args: LaunchArgs) -> tuple[str, str]:
    """Broker frontend and backend: as given, else ipc in our temp dir, else two free loopback
    ports."""
    given = args.broker.frontend, args.broker.backend
    if zmq.has("ipc"):
        private = [f"ipc://{tmp}/front", f"ipc://{tmp}/back"]
    else:
        private = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                private.append(f"tcp://127.0.0.1:{s.getsockname()[1]}")
    return given[0] or private[0], given[1] or private[1]


def _metrics_dir(tmp: Path, args: LaunchArgs) -> Path | None:
    """The metrics directory the ingress processes share, when there are several."""
    if ingress_procs(args) == 1:
        return None
    path = tmp / "metrics"
    path.mkdir(mode=0o700)
    return path


def child_env(args: LaunchArgs, name: str, metrics_dir: Path | None) -> dict[str, str]:
    """A child's environment: ours (with the expert knobs a config file set, which
    ``launch.config_file`` put there), unbuffered; the API key for ingress children only, in
    EMBEDMESH_API_KEY (their click reads it), never in argv."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if name.startswith("ingress"):
        if (key := api_key(args.ingress)) is not None:
            env[API_KEY_ENV] = key
        if metrics_dir is not None:
            env[MULTIPROC_ENV] = str(metrics_dir)
    return env


def worker_threads(args: LaunchArgs) -> int | None:
    """torch threads per worker: as given, else on CPU the cores split evenly between workers."""
    if args.worker.threads is not None:
        return args.worker.threads
    if args.worker.device_name != "cpu":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, args.supervisor.workers))


def role_commands(args: LaunchArgs, frontend: str, backend: str) -> dict[str, list[str]]:
    """The ``launch.cli`` arguments of every child, by child name, from the options object."""
    broker = child_argv(
        args, "broker", frontend=frontend, backend=backend, orphan_grace=_orphan_grace(args)
    )
    commands = {"broker": broker}
    workers = args.supervisor.workers
    if workers < 1:
        raise RoleFailed(f"--workers must be at least 1, not {workers}")
    threads = worker_threads(args)
    for i in range(workers):
        device: dict[str, object] = {"device": args.worker.device_name, "gpu": None}
        if args.worker.device == "cuda" and args.worker.gpu is None and workers > 1:
            device = {"gpu": i}  # one GPU per worker
        commands[f"worker-{i}"] = child_argv(
            args, "worker", broker_endpoints=(backend,), **device, threads=threads
        )
    commands.update(ingress_commands(args, [frontend]))
    return commands


def _orphan_grace(args: LaunchArgs) -> float:
    """How long the broker holds the queued work of a model whose workers all died: as given,
    else the request timeout. We restart a dead worker, and a restart with a model load takes
    longer than the broker's own default (one heartbeat expiry), which would fail with 503
    work that the restarted worker could still finish within its deadline."""
    if args.broker.orphan_grace is not None:
        return args.broker.orphan_grace
    return args.ingress.request_timeout


def ingress_commands(args: LaunchArgs, brokers: list[str]) -> dict[str, list[str]]:
    """The ``launch.cli`` arguments of each ingress child: ``ingress`` alone, or ``ingress-0``
    ... sharing the port. The API key is not among them (see ``child_env``)."""
    procs = ingress_procs(args)
    argv = child_argv(
        args,
        "ingress",
        broker_endpoints=tuple(brokers),
        # Explicit, so that an inherited EMBEDMESH_INGRESS_PROCS cannot make a child a parent.
        ingress_procs=1,
        reuse_port=procs > 1,
        restart_limit=None,  # a child supervises nothing
    )
    if procs == 1:
        return {"ingress": argv}
    # Each child's slot is its batch leases' owner id: the same across its restarts.
    return {f"ingress-{i}": [*argv, "--ingress-slot", str(i)] for i in range(procs)}

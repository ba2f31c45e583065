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

Children's output is forwarded to our stderr, each line prefixed with the child's name, and
its last lines are kept for those messages. Children run in their own session (a terminal's
Ctrl-C reaches only us, so the shutdown keeps its order) and die with us if we are killed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any

import zmq

from launch.ingress_role import DEFAULT_BROKER, api_key, ingress_procs
from mesh.config import DEFAULT_REQUEST_TIMEOUT_S
from mesh.ingress.config import DRAIN_GRACE_S

START_TIMEOUT_S = 120.0  # model load on a slow CPU plus imports; a GPU start is faster
# How long each stage of a stop may take before SIGKILL. Ingresses: their --drain-grace plus
# DRAIN_MARGIN_S (closing the mesh client, exiting the interpreter; 2..10 is reasonable).
# Workers: WORKER_STOP_S, the time to finish the batches they hold (their compute loop waits
# 10 s for the last one, their link 5 s more). The broker: STOP_GRACE_S.
DRAIN_MARGIN_S = 5.0
WORKER_STOP_S = 20.0
STOP_GRACE_S = 5.0
POLL_S = 0.2
# A role that dies while serving is restarted after RESTART_BACKOFF_S, doubling up to
# RESTART_BACKOFF_MAX_S; a run of STABLE_RUN_S resets its count. --restart-limit restarts in a
# row (default 5; 3..10 is reasonable) and the supervisor gives up: a crash loop is a bug or a
# broken host, and a service manager above us is better placed to act on it.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_RUN_S = 60.0
RESTART_LIMIT = 5
# Set in each child's environment: the child asks the kernel for SIGTERM when we die, then
# checks that we have not died already (see die_with_parent_from_env).
PARENT_PID_ENV = "EMBEDMESH_SUPERVISOR_PID"
TAIL_LINES = 12  # lines of a failed child's output shown to the user
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
API_KEY_ENV = "EMBEDMESH_API_KEY"
# Never inherited as they are: only ingress children get the key, resolved here (file read).
SECRET_ENV = (API_KEY_ENV, "EMBEDMESH_API_KEY_FILE")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # mesh.ingress.metrics.MULTIPROC_ENV


@dataclass
class Child:
    """One role process, how to start it again, its output pump and the tail of its output."""

    name: str
    proc: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0  # restarts in a row: since it last ran STABLE_RUN_S
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    pump: threading.Thread | None = None

    def last_line(self) -> str:
        """What it printed last: for a crash, the exception and its message."""
        return next((line.strip() for line in reversed(self.tail) if line.strip()), "no output")

    def tail_text(self, lines: int = TAIL_LINES) -> str:
        shown = [line for line in self.tail if line.strip()][-lines:]
        return "\n".join(f"  | {line}" for line in shown) or "  | (no output)"


class RoleFailed(Exception):
    """A child exited on its own, or the mesh did not come up in time."""


def run_all(opts: dict[str, Any]) -> int:
    """Run a whole mesh until a signal (exit 0) or a role's failure (exit 1)."""

    def start(tmp: Path, metrics_dir: Path | None, children: list[Child], stop: Event) -> None:
        frontend, backend = _endpoints(tmp)
        commands = role_commands(opts, frontend, backend)
        children += spawn(commands, lambda name: child_env(opts, name, metrics_dir))
        url, model = asyncio.run(_wait_ready(opts, children, stop))
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
        url = asyncio.run(_wait_listening(opts, children, stop))
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
        _stop_all(children, _drain_grace(opts), hurry)
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
    died = f"the {child.name} process {_how(code)} while serving: {child.last_line()}"
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
    child = _start_child(dead.name, dead.args, dead.env)
    child.restarts = dead.restarts
    _start_pump(child)
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
        *_flags(opts, "max_queued_tokens", "batch_timeout", "max_attempts", "aging"),
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
                "max_batch_tokens",
                "max_batch_requests",
                "warmup_buckets",
                "kernels",
                "exact_gelu",
                "no_compile",
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
            "max_body_bytes",
            "max_inputs",
            "tokenizer_threads",
            "request_timeout",
            "drain_grace",
            "body_timeout",
            "insecure",
        ),
    ]
    if procs == 1:
        return {"ingress": args}
    return {f"ingress-{i}": list(args) for i in range(procs)}


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded here, in the parent: the child between fork and exec should only make the call.
_LIBC = _load_libc()


def die_with_parent() -> None:
    """Get SIGTERM when the parent dies, even by SIGKILL (Linux): in a child before exec (as a
    ``preexec_fn``), or early in the child itself (``die_with_parent_from_env``)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent_from_env() -> None:
    """In a role process the supervisor started: die with it. Armed here, after exec, rather
    than in a ``preexec_fn``: the supervisor restarts roles while its pump threads run, and a
    ``preexec_fn`` is unsafe in a threaded parent. A parent that died before we armed it is no
    longer our parent, so that case is caught too."""
    parent = os.environ.pop(PARENT_PID_ENV, None)  # not inherited by anything we start
    if parent is None:
        return
    die_with_parent()
    if os.getppid() != int(parent):
        sys.exit(f"embedmesh: the supervisor (pid {parent}) is gone; not starting")


def spawn(commands: dict[str, list[str]], env_for: Callable[[str], dict[str, str]]) -> list[Child]:
    """Start one ``launch.cli`` child per command (name → arguments), each with the
    environment ``env_for(name)``; with ``_respawn``, the one place that starts role
    processes. Pipes buffer what the children print until their pumps start."""
    children = [_start_child(name, args, env_for(name)) for name, args in commands.items()]
    for child in children:
        _start_pump(child)
    return children


def _start_child(name: str, args: list[str], env: dict[str, str]) -> Child:
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**env, PARENT_PID_ENV: str(os.getpid())},
        start_new_session=True,
    )
    return Child(name, proc, args, env)


def _start_pump(child: Child) -> None:
    child.pump = threading.Thread(target=_pump, args=(child,), daemon=True)
    child.pump.start()


_stderr_lock = threading.Lock()


def _pump(child: Child) -> None:
    """Copy a child's output to our stderr, prefixed with its name; keep the tail."""
    assert child.proc.stdout is not None
    prefix = f"{child.name:<9}| ".encode()
    for raw in iter(child.proc.stdout.readline, b""):
        child.tail.append(raw.decode(errors="replace").rstrip())
        with _stderr_lock, contextlib.suppress(OSError, ValueError):
            sys.stderr.buffer.write(prefix + raw)
            sys.stderr.buffer.flush()


# ---- start-up and watching ------------------------------------------------------------------


def _check_alive(children: list[Child], when: str) -> None:
    for child in children:
        code = child.proc.poll()
        if code is not None:
            if child.pump is not None:
                child.pump.join(timeout=2)  # let the last lines in
            raise RoleFailed(
                f"the {child.name} process {_how(code)} {when}: {child.last_line()}\n"
                f"Last lines of its output:\n{child.tail_text()}"
            )


def _how(code: int) -> str:
    return f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _probe_host(host: str) -> str:
    """Where to reach an HTTP server bound on ``host`` (a wildcard means this host)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def _wait_ready(opts: dict[str, Any], children: list[Child], stop: Event) -> tuple[str, str]:
    """Until /health is 200, every ingress process has answered it and /v1/models counts every
    worker; returns (URL of /v1, the served model names)."""
    return await _wait_up(opts, children, stop, whole_mesh=True)


async def _wait_listening(opts: dict[str, Any], children: list[Child], stop: Event) -> str:
    """Until every ingress process of a group answers /health, whatever it says: the mesh
    behind them is not ours to wait for. A child that dies before is a start-up failure.
    Returns the URL of /v1."""
    url, _ = await _wait_up(opts, children, stop, whole_mesh=False)
    return url


async def _wait_up(
    opts: dict[str, Any], children: list[Child], stop: Event, whole_mesh: bool
) -> tuple[str, str]:
    import aiohttp

    base = f"http://{_probe_host(str(opts['http_host']))}:{opts['http_port']}"
    key = api_key(opts)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    want, procs = int(opts["workers"]) if whole_mesh else 0, ingress_procs(opts)
    health, models, pids = "no answer yet", [], set()
    deadline = time.monotonic() + START_TIMEOUT_S
    # A fresh connection per probe: the kernel picks the ingress process per connection, so a
    # round of 2N probes meets every listening one with high odds.
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=2),
        headers=headers,
        connector=aiohttp.TCPConnector(force_close=True),
    ) as http:
        while not stop.is_set():
            _check_alive(children, "during start-up")
            probes = 1 if procs == 1 else 2 * procs
            answers = await asyncio.gather(*(_health(http, base) for _ in range(probes)))
            pids.update(pid for _, pid in answers if pid is not None)
            health = "200" if any(s == "200" for s, _ in answers) else answers[0][0]
            # Each ingress answers with its pid once it listens; one answer is not the tier.
            listening = len(pids) >= procs or (procs == 1 and health.isdigit())
            if listening and not whole_mesh:
                return f"{base}/v1", ""
            if listening and health == "200":
                models = await _models(http, base)
                # /health is green with the first worker; wait for all, so that the line we
                # print (and a benchmark started on it) means the whole mesh.
                if sum(int(m.get("workers", want)) for m in models) >= want:
                    return f"{base}/v1", _model_names(models, opts)
            if time.monotonic() > deadline:
                registered = sum(int(m.get("workers", 0)) for m in models)
                raise RoleFailed(
                    f"the mesh was not ready within {START_TIMEOUT_S:.0f}s (GET /health: "
                    f"{health}; ingress processes answering: {len(pids)} of {procs}; workers "
                    f"serving: {registered} of {want}).\n"
                    + "\n".join(f"{c.name}:\n{c.tail_text(8)}" for c in children)
                )
            await asyncio.sleep(POLL_S)
    return f"{base}/v1", ""


async def _health(http: Any, base: str) -> tuple[str, int | None]:
    """GET /health: (the status, or the failure's name; the answering process's pid)."""
    import aiohttp

    try:
        async with http.get(f"{base}/health") as resp:
            body = await resp.json(content_type=None)
            pid = body.get("pid") if isinstance(body, dict) else None
            return str(resp.status), pid if isinstance(pid, int) else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return type(exc).__name__, None


async def _models(http: Any, base: str) -> list[dict[str, Any]]:
    """``data`` of GET /v1/models (each with ``id`` and ``workers``); [] when unreadable."""
    with contextlib.suppress(Exception):
        async with http.get(f"{base}/v1/models") as resp:
            if resp.status == 200:
                return list((await resp.json())["data"])
    return []


def _model_names(models: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    """The served names (fallbacks: --served-name, the model dir's name)."""
    if models:
        return ", ".join(str(m["id"]) for m in models)
    if opts.get("served_name"):
        return str(opts["served_name"])
    return Path(str(opts["model"])).name if opts.get("model") else "the default model"


# ---- stopping -------------------------------------------------------------------------------


def _stop_all(
    children: list[Child], drain_grace_s: float = DRAIN_GRACE_S, hurry: Event | None = None
) -> None:
    """Ingresses first (they refuse new requests and finish theirs, which needs the workers
    and the broker still up), then workers (they finish their batches, which needs the
    broker), then the broker; each stage SIGTERM, then SIGKILL after its wait, or at once
    when ``hurry`` is set."""
    stages = [
        ([c for c in children if c.name.startswith("ingress")], drain_grace_s + DRAIN_MARGIN_S),
        ([c for c in children if c.name.startswith("worker")], WORKER_STOP_S),
        ([c for c in children if c.name == "broker"], STOP_GRACE_S),
    ]
    for stage, wait_s in stages:
        _stop_stage(stage, wait_s, hurry or Event())
    for child in children:
        if child.pump is not None:
            child.pump.join(timeout=2)


def _stop_stage(stage: list[Child], wait_s: float, hurry: Event) -> None:
    for child in stage:
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for child in stage:
        while child.proc.poll() is None and time.monotonic() < deadline and not hurry.is_set():
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if child.proc.poll() is None:
            why = "a second signal" if hurry.is_set() else f"not stopped in {wait_s:.0f}s"
            print(f"embedmesh: {child.name}: {why}; killing it", file=sys.stderr, flush=True)
            child.proc.kill()
            child.proc.wait()

"""``mesh-launch --role ingress``: the REST bridge process, on uvloop.

With ``--ingress-procs N`` (N > 1) this process only spawns and watches N ingress children
(``launch.supervisor.run_ingress_group``) that share the HTTP port through SO_REUSEPORT.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
from pathlib import Path

import click

from launch.roles import Security, client_connector
from mesh.config import TOKENIZE_PROCESSES, Liveness
from mesh.ingress.config import BODY_TIMEOUT_S, DRAIN_GRACE_S, IngressConfig

DEFAULT_BROKER = "tcp://127.0.0.1:5555"


def default_ingress_procs() -> int:
    """Half the cores this process may run on, at least 1: tokenizing and encoding scale with
    processes, and the other half is left to the broker, workers and the kernel's network work
    (a 2-core host keeps its one ingress)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // 2)


API_KEY_ENV = "EMBEDMESH_API_KEY"
# Never inherited as they are: the supervisor gives only ingress children the key (a file read
# into it), and an ingress drops both once it has read them.
SECRET_ENV = (API_KEY_ENV, "EMBEDMESH_API_KEY_FILE")


def ingress_procs(opts: dict) -> int:
    """How many ingress processes serve the port: ``--ingress-procs``, else the default."""
    given = opts.get("ingress_procs")
    return int(given) if given is not None else default_ingress_procs()


def api_key(opts: dict) -> str | None:
    """The API key: ``--api-key`` (or EMBEDMESH_API_KEY), else the first line of
    ``--api-key-file``; both at once is a usage error (which one would win is not obvious)."""
    key, path = opts.get("api_key") or None, opts.get("api_key_file")
    if path is None:
        return key
    if key is not None:
        raise click.UsageError("give --api-key or --api-key-file, not both")
    lines = Path(path).read_text().splitlines()
    if not lines or not lines[0].strip():
        raise click.BadParameter(f"{path} is empty", param_hint="--api-key-file")
    return lines[0].strip()


def ingress_config(opts: dict, liveness: Liveness) -> IngressConfig:
    """IngressConfig from mesh-launch's options (click names)."""
    return IngressConfig(
        brokers=list(opts.get("broker_endpoints") or ()) or [DEFAULT_BROKER],
        http_host=str(opts["http_host"]),
        http_port=int(opts["http_port"]),
        api_key=api_key(opts),
        auto_truncate=bool(opts.get("auto_truncate")),
        tei_model=opts.get("tei_model") or None,
        max_body_bytes=int(opts["max_body_bytes"]),
        max_inputs=int(opts["max_inputs"]),
        tokenizer_threads=int(opts["tokenizer_threads"]),
        tokenize_processes=int(opts.get("tokenize_processes", TOKENIZE_PROCESSES)),
        request_timeout_s=float(opts["request_timeout"]),
        liveness=liveness,
        reuse_port=bool(opts.get("reuse_port")),
        drain_grace_s=float(opts.get("drain_grace", DRAIN_GRACE_S)),
        body_timeout_s=float(opts.get("body_timeout", BODY_TIMEOUT_S)),
    )


def run_ingress_role(opts: dict, liveness: Liveness, security: Security) -> int:
    """Serve until SIGTERM or SIGINT, then drain (refuse new work, finish what was accepted
    within --drain-grace); with several processes, run them as children instead. Returns the
    exit status."""
    if ingress_procs(opts) > 1:
        from launch.supervisor import run_ingress_group

        return run_ingress_group(opts)
    # Imported here: the parent of several ingresses (and the --role all supervisor, which
    # sizes them with this module) never serves, so it skips aiohttp, numpy and the client.
    import uvloop

    from mesh.ingress.server import serve

    cfg = ingress_config(opts, liveness)
    # Read: the processes this one starts (its tokenizer processes, started with it) need no
    # key, and would otherwise inherit it in their environment.
    for name in SECRET_ENV:
        os.environ.pop(name, None)
    connect = client_connector(security, "ingress")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: every thread's stack
    nice = int(opts.get("ingress_nice") or 0)
    if nice:  # lowering one's own priority needs no privilege
        os.nice(nice)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, stop, connect)

    uvloop.run(main())
    return 0

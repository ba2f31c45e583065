"""``mesh-launch --role ingress``: the REST bridge process, on uvloop.

With ``--ingress-procs N`` (N > 1) ``launch.cli`` runs ``launch.supervisor.run_ingress_group``
instead: N ingress children that share the HTTP port through SO_REUSEPORT.
"""

from __future__ import annotations

import asyncio
import faulthandler
import importlib.util
import os
import signal
import socket
from pathlib import Path

import click

from launch.options import DEFAULT_FRONTEND, IngressArgs, LaunchArgs
from launch.roles import Security, client_connector
from mesh.config import Liveness
from mesh.ingress.config import ConnectionLimits, IngressConfig, JobsConfig
from mesh.jobs import default_state_dir

API_KEY_ENV = "EMBEDMESH_API_KEY"
# Never inherited as they are: the supervisor gives only ingress children the key (a file read
# into it), and an ingress drops both once it has read them.
SECRET_ENV = (API_KEY_ENV, "EMBEDMESH_API_KEY_FILE")


def api_key(args: IngressArgs) -> str | None:
    """The API key: ``--api-key`` (or EMBEDMESH_API_KEY), else the first line of
    ``--api-key-file``; both at once is a usage error (which one would win is not obvious)."""
    key, path = args.api_key or None, args.api_key_file
    if path is None:
        return key
    if key is not None:
        raise click.UsageError("give --api-key or --api-key-file, not both")
    lines = Path(path).read_text().splitlines()
    if not lines or not lines[0].strip():
        raise click.BadParameter(f"{path} is empty", param_hint="--api-key-file")
    return lines[0].strip()


def ingress_config(args: LaunchArgs, liveness: Liveness) -> IngressConfig:
    """The IngressConfig of mesh-launch's options."""
    ing = args.ingress
    return IngressConfig(
        brokers=list(args.link.broker_endpoints) or [DEFAULT_FRONTEND],
        http_host=ing.http_host,
        http_port=ing.http_port,
        api_key=api_key(ing),
        auto_truncate=ing.auto_truncate,
        tei_model=ing.tei_model or None,
        max_body_bytes=ing.max_body_bytes,
        max_inputs=ing.max_inputs,
        tokenizer_threads=ing.tokenizer_threads,
        tokenize_processes=ing.tokenize_processes,
        request_timeout_s=ing.request_timeout,
        liveness=liveness,
        reuse_port=ing.reuse_port,
        drain_grace_s=ing.drain_grace,
        body_timeout_s=ing.body_timeout,
        connection_limits=ConnectionLimits(
            ing.header_timeout, ing.idle_timeout, ing.max_connections
        ),
        max_response_bytes=ing.max_response_bytes,
        response_budget_bytes=ing.response_budget_bytes,
        jobs=jobs_config(ing),
    )


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str, flag: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"`` (a bare number: days) in seconds."""
    value = text.strip().lower()
    unit = DURATION_UNITS.get(value[-1:])
    number = value[:-1] if unit is not None else value
    try:
        seconds = float(number) * (unit or DURATION_UNITS["d"])
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise click.BadParameter(f"{text!r} is not a duration like 30d or 12h", param_hint=flag)
    return seconds


def jobs_config(ing: IngressArgs) -> JobsConfig:
    """The batch API's store and limits; its lease owner id is this host, port and slot (stable
    across restarts, so a restarted process frees its killed predecessor's leases at once)."""
    port = str(ing.http_port) if ing.http_port else f"pid{os.getpid()}"
    if ing.state_url:
        if not ing.state_url.startswith(("postgresql://", "postgres://")):
            raise click.BadParameter("must be a postgresql://... URL", param_hint="--state-url")
        if importlib.util.find_spec("psycopg") is None:
            raise click.UsageError("--state-url needs psycopg: pip install 'embedmesh[postgres]'")
    return JobsConfig(
        state_dir=str(ing.state_dir or default_state_dir()),
        state_url=ing.state_url or None,
        owner=f"{socket.gethostname()}:{port}:{ing.ingress_slot or 0}",
        max_file_bytes=ing.max_batch_file_bytes,
        max_state_bytes=ing.max_state_bytes,
        retention_s=duration_s(ing.batch_retention, "--batch-retention"),
    )


def run_ingress_role(args: LaunchArgs, liveness: Liveness, security: Security) -> int:
    """Serve until SIGTERM or SIGINT, then drain (refuse new work, finish what was accepted
    within --drain-grace). Returns the exit status."""
    # Imported here: the parent of several ingresses (and the --role all supervisor, which
    # sizes them with this module) never serves, so it skips aiohttp, numpy and the client.
    import uvloop

    from launch.ports import probe
    from mesh.ingress.server import serve

    cfg = ingress_config(args, liveness)
    if not cfg.reuse_port and cfg.http_port != 0:
        # A busy port fails here, in one line, before the broker links and the tokenizers.
        probe(cfg.http_host, cfg.http_port, "HTTP", "choose one with --http-port")
    # Read: the processes this one starts (its tokenizer processes, started with it) need no
    # key, and would otherwise inherit it in their environment.
    for name in SECRET_ENV:
        os.environ.pop(name, None)
    connect = client_connector(security, "ingress")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: every thread's stack
    if args.ingress.ingress_nice:  # lowering one's own priority needs no privilege
        os.nice(args.ingress.ingress_nice)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, stop, connect)

    uvloop.run(main())
    return 0

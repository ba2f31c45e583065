"""``mesh-launch --role ingress``: the REST bridge process, on uvloop."""

from __future__ import annotations

import asyncio
import signal

import uvloop

from launch.roles import Security, client_connector
from mesh.config import Liveness
from mesh.ingress.config import IngressConfig
from mesh.ingress.server import serve

DEFAULT_BROKER = "tcp://127.0.0.1:5555"


def ingress_config(opts: dict, liveness: Liveness) -> IngressConfig:
    """IngressConfig from mesh-launch's options (click names)."""
    return IngressConfig(
        brokers=list(opts.get("broker_endpoints") or ()) or [DEFAULT_BROKER],
        http_host=str(opts["http_host"]),
        http_port=int(opts["http_port"]),
        api_key=opts.get("api_key") or None,
        auto_truncate=bool(opts.get("auto_truncate")),
        max_body_bytes=int(opts["max_body_bytes"]),
        max_inputs=int(opts["max_inputs"]),
        tokenizer_threads=int(opts["tokenizer_threads"]),
        request_timeout_s=float(opts["request_timeout"]),
        liveness=liveness,
    )


def run_ingress_role(opts: dict, liveness: Liveness, security: Security) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    cfg = ingress_config(opts, liveness)
    connect = client_connector(security, "ingress")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, stop, connect)

    uvloop.run(main())

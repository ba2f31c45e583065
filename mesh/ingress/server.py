"""Run one ingress until told to stop: the HTTP site, the mesh client, a graceful shutdown."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable

import zmq
from aiohttp import web

from mesh.client import MeshClient
from mesh.ingress.app import STATE, create_app
from mesh.ingress.config import IngressConfig
from mesh.ingress.metrics import multiprocess_dir

log = logging.getLogger("embedmesh.ingress")

SHUTDOWN_GRACE_S = 10.0  # in-flight requests get this long to finish after a stop; 1..60
# How often one of several processes writes its per-process gauges for scrapes that reach the
# others; 0.5..5 s is reasonable (a scrape interval is 15 s or more).
PUBLISH_INTERVAL_S = 1.0


async def serve(
    cfg: IngressConfig,
    stop: asyncio.Event,
    connect: Callable[[zmq.Socket, str], None] | None = None,
) -> None:
    """Serve HTTP on ``cfg.http_host:cfg.http_port`` until ``stop`` is set, then stop taking
    connections, let in-flight requests finish (up to SHUTDOWN_GRACE_S) and close the client."""
    client = MeshClient(
        cfg.brokers,
        liveness=cfg.liveness,
        tokenizer_threads=cfg.tokenizer_threads,
        connect=connect,
        default_timeout_s=cfg.request_timeout_s,
    )
    await client.start()
    app = create_app(cfg, client)
    # handler_cancellation: a client that hangs up cancels its handler, hence its mesh work.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,  # /metrics counts every request; a log line each costs at load
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    # One of several processes: keep our share of the per-process gauges fresh for scrapes
    # that reach a sibling. Alone, a scrape of this process refreshes them itself.
    publisher = asyncio.create_task(_publish_metrics(app)) if multiprocess_dir() else None
    try:
        await runner.setup()
        site = web.TCPSite(
            runner, cfg.http_host, cfg.http_port, reuse_address=True, reuse_port=cfg.reuse_port
        )
        await site.start()
        if cfg.api_key is None and not _is_loopback(cfg.http_host):
            log.warning("listening on %s without --api-key: anyone who can reach it can use it",
                        cfg.http_host)  # fmt: skip
        log.info("ingress up: http://%s:%d (brokers %s)", cfg.http_host, cfg.http_port,
                 ", ".join(cfg.brokers))  # fmt: skip
        await stop.wait()
        log.info("ingress stopping: finishing in-flight requests")
    finally:
        if publisher is not None:
            publisher.cancel()
        await runner.cleanup()
        await client.close()
        log.info("ingress stopped")


async def _publish_metrics(app: web.Application) -> None:
    """Write this process's per-process gauges every PUBLISH_INTERVAL_S."""
    metrics = app[STATE].metrics
    while True:
        metrics.publish()
        await asyncio.sleep(PUBLISH_INTERVAL_S)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

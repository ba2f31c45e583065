"""Start-up probes: until the ingress processes answer ``GET /health`` (and, for a whole mesh,
until it is green and ``GET /v1/models`` counts every worker). A child that dies meanwhile is
a failed start."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from threading import Event
from typing import Any

from launch.children import POLL_S, Child, RoleFailed, check_alive
from launch.ingress_role import api_key
from launch.options import LaunchArgs, ingress_procs

START_TIMEOUT_S = 120.0  # model load on a slow CPU plus imports; a GPU start is faster


def _probe_host(host: str) -> str:
    """Where to reach an HTTP server bound on ``host`` (a wildcard means this host)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def wait_ready(args: LaunchArgs, children: list[Child], stop: Event) -> tuple[str, str]:
    """Until /health is 200, every ingress process has answered it and /v1/models counts every
    worker; returns (URL of /v1, the served model names)."""
    return await _wait_up(args, children, stop, whole_mesh=True)


async def wait_listening(args: LaunchArgs, children: list[Child], stop: Event) -> str:
    """Until every ingress process of a group answers /health, whatever it says: the mesh
    behind them is not ours to wait for. A child that dies before is a start-up failure.
    Returns the URL of /v1."""
    url, _ = await _wait_up(args, children, stop, whole_mesh=False)
    return url


async def _wait_up(
    args: LaunchArgs, children: list[Child], stop: Event, whole_mesh: bool
) -> tuple[str, str]:
    import aiohttp

    base = f"http://{_probe_host(args.ingress.http_host)}:{args.ingress.http_port}"
    key = api_key(args.ingress)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    want, procs = args.supervisor.workers if whole_mesh else 0, ingress_procs(args)
    health, models, pids, green = "no answer yet", [], set(), set()
    deadline = time.monotonic() + START_TIMEOUT_S
    # A fresh connection per probe: the kernel picks the ingress process per connection, so a
    # round of 2N probes meets every listening one with high odds.
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=2),
        headers=headers,
        connector=aiohttp.TCPConnector(force_close=True),
    ) as http:
        while not stop.is_set():
            check_alive(children, "during start-up")
            probes = 1 if procs == 1 else 2 * procs
            answers = await asyncio.gather(*(_health(http, base) for _ in range(probes)))
            pids.update(pid for _, pid in answers if pid is not None)
            green.update(pid for s, pid in answers if pid is not None and s == "200")
            health = "200" if any(s == "200" for s, _ in answers) else answers[0][0]
            # Each ingress answers with its pid once it listens; one answer is not the tier,
            # and a whole mesh serves once each of them is green (has the catalog).
            listening = len(pids) >= procs or (procs == 1 and health.isdigit())
            if listening and not whole_mesh:
                return f"{base}/v1", ""
            if health == "200" and (len(green) >= procs or procs == 1):
                models = await _models(http, base)
                # /health is green with the first worker; wait for all, so that the line we
                # print (and a benchmark started on it) means the whole mesh.
                if sum(int(m.get("workers", want)) for m in models) >= want:
                    return f"{base}/v1", _model_names(models, args)
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


def _model_names(models: list[dict[str, Any]], args: LaunchArgs) -> str:
    """The served names (fallbacks: --served-name, the model dir's name)."""
    if models:
        return ", ".join(str(m["id"]) for m in models)
    if args.worker.served_name:
        return args.worker.served_name
    return Path(args.worker.model).name if args.worker.model else "the default model"

"""The start-up probe of ``--role all``: the serving line waits for every ingress process."""

from __future__ import annotations

import asyncio
from threading import Event
from typing import Any

from launch import readiness
from launch.cli import parse


def test_a_whole_mesh_serves_once_every_ingress_process_is_green(monkeypatch) -> None:
    # Two ingress processes, probed 2N = 4 times a round: pid 2 listens but has no catalog yet
    # (503) for the first two rounds, while pid 1 is green from the start.
    calls: list[int] = []

    async def health(http: Any, base: str) -> tuple[str, int]:
        call = len(calls)
        calls.append(call)
        pid = 1 + call % 2
        return ("503" if pid == 2 and call // 4 < 2 else "200"), pid

    async def models(http: Any, base: str) -> list[dict[str, Any]]:
        return [{"id": "all-MiniLM-L6-v2", "workers": 1}]

    monkeypatch.setattr(readiness, "_health", health)
    monkeypatch.setattr(readiness, "_models", models)
    monkeypatch.setattr(readiness, "POLL_S", 0.0)
    args = parse(["--ingress-procs", "2", "--http-port", "9"])[1]
    url, model = asyncio.run(readiness.wait_ready(args, [], Event()))
    assert (url, model) == ("http://127.0.0.1:9/v1", "all-MiniLM-L6-v2")
    assert len(calls) == 3 * 4, "probed until the second process was green too"

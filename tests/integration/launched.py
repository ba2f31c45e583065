"""``mesh-launch`` run as a user runs it (a real process tree), and /proc helpers to inspect it.

Shared by the supervisor tests and the ingress-processes tests.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.host import process_tree

START_S = 150  # the supervisor's own start-up timeout is 120 s
MODEL = "all-MiniLM-L6-v2"


def launch_command() -> list[str]:
    script = Path(sys.executable).with_name("mesh-launch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "launch.cli"]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, from /proc (no psutil): bench's process tree less
    its root."""
    return process_tree(pid) - {pid}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: set[int], timeout_s: float = 5) -> list[int]:
    """Waits until the processes ``pids`` are gone; those still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def cmdline(pid: int) -> str:
    """What ``ps`` shows any user: the process's arguments, space-separated."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    """A process's environment (readable by its own user only)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


@dataclass
class Launched:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    stderr: Path

    def first_line(self, timeout_s: float) -> str:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"no line on stdout in {timeout_s}s\n{self.stderr.read_text()[-4000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start(
    tmp_path: Path,
    *args: str,
    role: str = "all",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Launched:
    """``mesh-launch --role ROLE ARGS...`` (in ``cwd``); stdout lines queued, stderr to a file."""
    stderr = tmp_path / f"{role}.err"
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [*launch_command(), "--role", role, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=full_env,
            cwd=cwd,
        )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line.rstrip("\n")) for line in proc.stdout], daemon=True
    ).start()
    return Launched(proc, lines, stderr)


def request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: dict | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One request on ``conn`` (kept alive: the same ingress process answers every request of
    one connection); (status, body)."""
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"Content-Type": "application/json", **(headers or {})} if data else dict(headers or {})
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    return resp.status, resp.read()


# ---- load: clients posting embeddings one after another -----------------------------------


@dataclass
class Outcome:
    """One request of a load client: when it ran, and how it ended."""

    client: int
    started: float  # time.monotonic()
    ended: float
    status: int  # the HTTP status; 0 when no response came
    kind: str  # "ok" | "refused" (a clean 503, or the connection refused) | "error"
    detail: str = ""


class Load:
    """``clients`` clients, each on its own kept-alive connection, posting one request of
    ``texts[i]`` inputs after another to ``base`` (…/v1) in a thread of their own, until
    ``stop()`` (or, with ``until_refused``, until a connection is refused: the server is gone).
    With ``netns``, the clients run inside that network namespace (a host of bench/netns.py).

    Every request is classified: **ok** is a 200 whose body holds every embedding in full;
    **refused** is a 503 in the JSON error shape or a connection the kernel refused (nothing
    was sent); anything else, a reset, a disconnect without a response, a cut body, another
    status, is an **error**: a request dropped or failed."""

    def __init__(
        self, base: str, texts: list[int], until_refused: bool = False, netns: str | None = None
    ) -> None:
        self.base = base
        self.netns = netns
        self.texts = texts
        self.until_refused = until_refused
        self.outcomes: list[Outcome] = []
        self.sending: dict[int, float] = {}  # client -> when its request in progress started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 180) -> list[Outcome]:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "load clients did not finish"
        return self.outcomes

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        """Until ``count`` requests ended ok (the load is flowing)."""
        deadline = time.monotonic() + timeout_s
        while self.count("ok") < count:
            assert time.monotonic() < deadline, f"load not flowing: {self.summary()}"
            time.sleep(0.05)

    def count(self, kind: str) -> int:
        return sum(o.kind == kind for o in list(self.outcomes))

    def summary(self) -> dict[str, int]:
        """Requests by kind and status, e.g. {'sent': 40, 'ok': 37, 'refused': 3, '503': 1}."""
        out = list(self.outcomes)
        counts: dict[str, int] = {"sent": len(out)}
        for o in out:
            counts[o.kind] = counts.get(o.kind, 0) + 1
            if o.status not in (0, 200):
                counts[str(o.status)] = counts.get(str(o.status), 0) + 1
        return counts

    def errors(self) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.kind == "error"]

    def _run(self) -> None:
        if self.netns is not None:
            from bench.netns import enter

            enter(self.netns)  # this thread only: its sockets live on that host
        asyncio.run(self._clients())

    async def _clients(self) -> None:
        await asyncio.gather(*(self._client(i, n) for i, n in enumerate(self.texts)))

    async def _client(self, index: int, texts: int) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=1)  # one connection, kept alive
        timeout = aiohttp.ClientTimeout(total=150)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            n = 0
            while not self._stop.is_set():
                body = {"model": MODEL, "input": [f"client {index} request {n} text {j}: "
                        "embeddings of a mesh that drains" for j in range(texts)]}  # fmt: skip
                outcome = await self._post(http, index, body)
                self.outcomes.append(outcome)
                n += 1
                if self.until_refused and outcome.kind == "refused" and outcome.status == 0:
                    return
                if outcome.kind != "ok":
                    await asyncio.sleep(0.1)  # no tight loop against a server that is down

    async def _post(self, http: Any, index: int, body: dict) -> Outcome:
        import aiohttp

        started = self.sending[index] = time.monotonic()
        try:
            async with http.post(f"{self.base}/embeddings", json=body) as resp:
                raw = await resp.read()
                status = resp.status
        except aiohttp.ClientConnectorError as exc:  # connect() failed: nothing was sent
            return Outcome(index, started, time.monotonic(), 0, "refused", repr(exc))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return Outcome(index, started, time.monotonic(), 0, "error", repr(exc))
        kind, detail = _classify(status, raw, len(body["input"]))
        return Outcome(index, started, time.monotonic(), status, kind, detail)


def _classify(status: int, raw: bytes, texts: int) -> tuple[str, str]:
    """("ok" | "refused" | "error", what was wrong) for a response that came in full."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return "error", f"{status}: not JSON: {raw[:200]!r}"
    if status == 200:
        data = doc.get("data", [])
        if len(data) == texts and all(len(d.get("embedding", ())) == 384 for d in data):
            return "ok", ""
        return "error", f"200 with {len(data)} of {texts} embeddings"
    shaped = isinstance(doc, dict) and isinstance(doc.get("error"), dict)
    if status == 503 and shaped:
        return "refused", str(doc["error"].get("message"))
    return "error", f"{status}: {raw[:300]!r}"


def role_pids(supervisor: int, role: str) -> set[int]:
    """The live children of ``supervisor`` that run ``--role ROLE``."""
    return {pid for pid in descendants(supervisor) if f"--role {role}" in cmdline(pid)}


def served_workers(base: str) -> int:
    """Workers GET {base}/models counts for MODEL; 0 when it does not answer."""
    try:
        with urllib.request.urlopen(f"{base}/models", timeout=10) as resp:
            models = json.loads(resp.read())["data"]
    except (OSError, ValueError, KeyError):
        return 0
    return sum(int(m.get("workers", 0)) for m in models if m.get("id") == MODEL)


def base_url(line: str) -> str:
    """The URL of /v1 in the line ``mesh-launch --role all`` prints once it serves."""
    assert line.startswith("embedmesh serving "), line
    return line.split(" at ")[1].split(" ")[0]

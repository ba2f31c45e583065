"""The examples of README.md and docs/ run as written, against the server they say they need.

Blocks are marked as ``tests/doc_blocks.py`` describes: ``<!-- run -->`` blocks run against
``mesh-launch --role all`` (what ``make serve`` starts, all-MiniLM-L6-v2); ``<!-- run: NAME -->``
blocks against the page's ``<!-- server: NAME -->`` command, run in a directory where the test
built a small model of the directory name that command serves (a cross-encoder, a SPLADE
model; the page's download line needs network and is not run). Only the address is rewritten,
to free ports: the HTTP port, and a ``--frontend tcp://127.0.0.1:5555`` of the server's line (the
``meshclient`` server, ``mesh-launch --role all --frontend ...``), whose endpoint ``--role all``
must then print on its ``MeshClient`` line. Each block must exit 0 and print what its marker
expects.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.spawn import free_port
from tests.doc_blocks import DEFAULT_SERVER, Block, all_blocks
from tests.integration.launched import START_S, Launched, start
from tests.st_models import build_cross_encoder, build_splade

RUN_S = 120
PAGE_FRONTEND = "tcp://127.0.0.1:5555"
MODEL_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "rerank": lambda path: build_cross_encoder(path, num_labels=1),
    "sparse": build_splade,
}
BLOCKS = sorted((b for b in all_blocks() if b.kind == "run"), key=lambda b: b.server)
SERVER_BLOCKS = {b.server: b for b in all_blocks() if b.kind == "server"}


class Server:
    """One running server of a page: its HTTP port and broker frontend, and how to stop it."""

    def __init__(self, port: int, frontend: str | None, stop: Callable[[], None]) -> None:
        self.port, self.frontend, self.stop = port, frontend, stop

    def rewrite(self, code: str) -> str:
        """The block with only its addresses moved to this server's."""
        for host in ("127.0.0.1:8000", "localhost:8000"):
            code = code.replace(host, f"127.0.0.1:{self.port}")
        if self.frontend:
            code = code.replace(PAGE_FRONTEND, self.frontend)
        return code


def _role_all(tmp: Path, args: list[str], cwd: Path) -> Server:
    """``mesh-launch ARGS --http-port PORT`` (a page's ``--frontend`` moved to a free port),
    once it prints its URL and, after it, the frontend a ``MeshClient`` should use."""
    role = "all"
    if "--role" in args:
        at = args.index("--role")
        role, args = args[at + 1], args[:at] + args[at + 2 :]
    frontend = None
    if "--frontend" in args:
        at = args.index("--frontend")
        assert args[at + 1] == PAGE_FRONTEND, f"the page's frontend is {args[at + 1]!r}"
        frontend = f"tcp://127.0.0.1:{free_port()}"
        args = [*args[:at], "--frontend", frontend, *args[at + 2 :]]
    port = free_port()
    launched: Launched = start(tmp, *args, "--http-port", str(port), role=role, cwd=cwd)
    line = launched.first_line(START_S)
    assert "http://" in line, f"{line!r}\n{launched.stderr.read_text()[-4000:]}"
    if frontend:
        line = launched.first_line(START_S)
        assert line.strip() == f"embedmesh broker frontend (MeshClient): {frontend}", line
    return Server(port, frontend, launched.kill)


def _launch_line(block: Block) -> list[str]:
    lines = [line for line in block.code.splitlines() if line.startswith("mesh-launch")]
    assert len(lines) == 1, f"{block.where}: one mesh-launch line expected"
    return shlex.split(lines[0])[1:]


def _start(name: str, tmp: Path) -> Server:
    if name == DEFAULT_SERVER:
        return _role_all(tmp, [], tmp)
    args = _launch_line(SERVER_BLOCKS[name])
    if "--model" in args:
        model_dir = args[args.index("--model") + 1]
        MODEL_BUILDERS[name](tmp / model_dir)
    return _role_all(tmp, args, tmp)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Server]]:
    """Starts the server a block needs, stopping the one before (the blocks come grouped by
    server, so one mesh runs at a time)."""
    running: dict[str, Server] = {}

    def get(name: str) -> Server:
        if name not in running:
            for other in running.values():
                other.stop()
            running.clear()
            running[name] = _start(name, tmp_path_factory.mktemp(f"docs-{name}"))
        return running[name]

    yield get
    for server in running.values():
        server.stop()


def _run(block: Block, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    bindir = str(Path(sys.executable).parent)
    # As a user's shell runs it: huggingface_hub refuses even a local base_url when told offline.
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {key: value for key, value in os.environ.items() if key not in offline}
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    command = [sys.executable, "-c", code] if block.lang == "python" else ["bash", "-c", code]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=RUN_S)  # fmt: skip


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.where}-{b.server}")
def test_doc_example_runs_and_prints_what_the_doc_says(
    block: Block, servers: Callable[[str], Server], tmp_path: Path
) -> None:
    server = servers(block.server)
    code = server.rewrite(block.code)
    assert code != block.code, f"{block.where}: the example names no address to rewrite"
    done = _run(block, "set -euo pipefail\n" + code if block.lang == "sh" else code, tmp_path)
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    for text in block.expect:
        assert text in done.stdout, f"{block.where}: {text!r} not in\n{done.stdout[-2000:]}"


def test_every_example_marks_what_it_must_print() -> None:
    assert BLOCKS, "no marked examples found"
    assert [b.where for b in BLOCKS if not b.expect] == []

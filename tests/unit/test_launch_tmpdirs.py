"""The launcher's private temp dirs: named after their process; stale ones removed, never one
in use. Real processes stand for live and dead owners."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launch import tmpdirs


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_dirs_are_removed_and_live_or_foreign_ones_kept(tmp_path: Path) -> None:
    dead = _dead_pid()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            names = {
                "stale": f"embedmesh-{dead}-abc_12",
                "stale_ingress": f"embedmesh-ingress-{dead}-x9y8z7w6",
                "stale_tokenizers": f"embedmesh-tokenizers-{dead}-q1w2e3r4",
                "live": f"embedmesh-{live.pid}-abc_12",
                "mine": f"embedmesh-ingress-{os.getpid()}-k3k3k3k3",
                "older_version": "embedmesh-k2j4h5g6",  # no pid: may belong to a running mesh
                "other_app": f"embedmeshing-{dead}-abcdefgh",
            }
            for name in names.values():
                (tmp_path / name).mkdir()
                (tmp_path / name / "front").write_text("x")
            (tmp_path / f"embedmesh-{dead}-file0000").write_text("a file, not a dir")
            removed = tmpdirs.remove_stale(tmp_path)
        finally:
            live.kill()
    gone = {names["stale"], names["stale_ingress"], names["stale_tokenizers"]}
    assert {p.name for p in removed} == gone
    left = {p.name for p in tmp_path.iterdir()}
    assert not gone & left
    assert {names[k] for k in ("live", "mine", "older_version", "other_app")} <= left
    assert f"embedmesh-{dead}-file0000" in left


def test_a_private_dir_carries_its_pid_and_clears_stale_ones_first(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stale = tmp_path / f"embedmesh-{_dead_pid()}-aaaaaaaa"
    stale.mkdir()
    made = tmpdirs.private_dir("ingress")
    assert made.parent == tmp_path and made.is_dir()
    assert made.name.startswith(f"embedmesh-ingress-{os.getpid()}-")
    assert tmpdirs.owner_pid(made) == os.getpid()
    assert tmpdirs.owner_pid(tmpdirs.private_dir()) == os.getpid()
    assert not stale.exists()

"""What a launcher leaves behind and shows: a SIGKILLed launcher's temp dir is removed by the
next one to start (never one in use), and an API key typed on the command line is warned
about. Real ``mesh-launch`` processes."""

from __future__ import annotations

import signal
from pathlib import Path

from bench.spawn import free_port
from launch.cli import API_KEY_IN_ARGV
from tests.integration.launched import START_S, Launched, descendants, start, wait_gone


def _group(run_dir: Path, tmp: Path, port: int, *key: str) -> Launched:
    """``--role ingress --ingress-procs 2`` on ``port`` with ``tmp`` as its temp dir; its
    output in ``run_dir``."""
    run_dir.mkdir()
    return start(
        run_dir,
        "--ingress-procs", "2", "--http-port", str(port),
        "--broker", f"tcp://127.0.0.1:{free_port()}", *key,
        role="ingress",
        env={"TMPDIR": str(tmp)},
    )  # fmt: skip


def _dirs_of(tmp: Path, pid: int) -> list[Path]:
    return list(tmp.glob(f"embedmesh-ingress-{pid}-*"))


def test_a_killed_launchers_temp_dir_goes_at_the_next_start_and_a_live_ones_stays(
    tmp_path: Path,
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "key").write_text("s3cret\n")
    port = free_port()
    first = _group(tmp_path / "a", tmp, port, "--api-key", "s3cret")
    try:
        assert "serving" in first.first_line(START_S)
        (mine,) = _dirs_of(tmp, first.proc.pid)
        # The same port again: this launcher fails, after its start looked for stale dirs.
        busy = _group(tmp_path / "b", tmp, port)
        assert busy.proc.wait(timeout=60) == 1
        assert mine.is_dir(), "a dir in use was removed"
        children = descendants(first.proc.pid)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        assert not wait_gone(children, 30), "children outlived their killed launcher"
        assert mine.is_dir()  # SIGKILL: nobody removed it
    finally:
        first.kill()
    err = first.stderr.read_text()
    assert err.count(API_KEY_IN_ARGV) == 1, err[-3000:]
    again = _group(tmp_path / "c", tmp, port, "--api-key-file", str(tmp_path / "key"))
    try:
        assert "serving" in again.first_line(START_S)
        assert not mine.exists(), "the killed launcher's temp dir is still there"
        assert len(_dirs_of(tmp, again.proc.pid)) == 1
        again.proc.send_signal(signal.SIGTERM)
        assert again.proc.wait(timeout=60) == 0
    finally:
        again.kill()
    assert not _dirs_of(tmp, again.proc.pid), "a launcher stopped cleanly removes its dir"
    assert API_KEY_IN_ARGV not in again.stderr.read_text()

"""bench/cluster_hosts.py: the ssh command a remote role or load process runs as, down to the
shell text the remote host executes, and that text's promise tried here with ``sh``: the role
runs until ssh's input closes, then gets SIGTERM; a load process keeps its input."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from bench.cluster_hosts import Place, Started, ssh_argv, stop_all
from bench.topology import Host, Ssh

SSH = Ssh("bench@10.0.0.11", "/srv/mesh/.venv/bin/python", "cd /srv/mesh &&", ("-p", "2222"))


def _remote(argv: list[str]) -> list[str]:
    """What the remote login shell is asked to run, split as it splits it."""
    assert argv.index("--") == len(argv) - 2
    return shlex.split(argv[-1])


def test_a_role_runs_in_the_background_of_a_shell_that_ends_it_with_ssh() -> None:
    argv = ssh_argv(SSH, "launch.cli", ["--role", "broker", "--frontend", "tcp://10.0.0.11:5555"],
                    {"HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert argv[:7] == ["ssh", "-T", "-o", "BatchMode=yes", "-p", "2222", "bench@10.0.0.11"]
    sh, flag, script = _remote(argv)
    assert (sh, flag) == ("sh", "-c")
    assert script == (
        "exec 3<&0; cd /srv/mesh && exec env HF_HUB_OFFLINE=1 /srv/mesh/.venv/bin/python -m "
        "launch.cli --role broker --frontend tcp://10.0.0.11:5555 </dev/null & p=$!; "
        "(cat <&3 >/dev/null; kill -TERM $p 2>/dev/null) & wait $p"
    )


def test_a_load_process_runs_in_the_foreground_on_sshs_input() -> None:
    argv = ssh_argv(Ssh("h"), "bench.cluster_load", [], {}, stdin_commands=True)
    assert argv == ["ssh", "-T", "-o", "BatchMode=yes", "h", "--",
                    "sh -c 'exec python3 -m bench.cluster_load'"]  # fmt: skip


def test_flags_with_spaces_and_quotes_reach_the_remote_process_intact() -> None:
    argv = ssh_argv(Ssh("h", prefix=""), "launch.cli", ["--api-key", "it's a key"], {})
    script = _remote(argv)[2]
    assert "'it'\"'\"'s a key'" in script  # shlex.join's quoting, undone by the remote sh


def test_the_remote_script_stops_its_role_when_the_input_closes() -> None:
    """The role command run by a local sh exactly as sshd would run it: alive while its input
    is open, SIGTERMed (and the shell gone) once it closes."""
    local = Ssh("unused", sys.executable)
    argv = ssh_argv(local, "http.server", ["0", "--bind", "127.0.0.1"], {})
    shell = subprocess.Popen(["sh", "-c", argv[-1]], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(1.0)
        assert shell.poll() is None  # serving while ssh's input is open
        assert shell.stdin is not None
        shell.stdin.close()
        assert shell.wait(10) == 143  # the role's SIGTERM, as `wait` reports it
    finally:
        if shell.poll() is None:
            shell.kill()


def test_a_local_place_runs_this_interpreter_and_stops_what_it_started(tmp_path) -> None:  # noqa: ANN001
    place = Place(Host("here", kind="local"), "127.0.0.1")
    assert place.argv("bench.null_worker", ["--device", "cpu"]) == [
        sys.executable, "-m", "bench.null_worker", "--device", "cpu"]  # fmt: skip
    started = place.start("sleeper", "http.server", ["0", "--bind", "127.0.0.1"], tmp_path / "l")
    assert isinstance(started, Started) and started.proc.poll() is None
    assert place.reach(lambda: 42) == 42
    stop_all(place.started, grace_s=10)
    assert started.proc.returncode == -15

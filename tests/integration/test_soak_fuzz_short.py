"""Short versions of the soak and the fuzz (``mesh-bench soak``, ``mesh-bench fuzz``), run as
a user would: each must pass its own criteria. The long runs and their figures are in docs/reliability.md."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]
FUZZ_FRAMES = 20_000


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Both at once (about 50 s on two shared cores): the fuzz's own mesh beside the soak's."""
    tmp = tmp_path_factory.mktemp("soak-fuzz")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    commands = {
        "fuzz": ["-m", "bench.cli", "fuzz", "--frames", str(FUZZ_FRAMES), "--sockets", "4"],
        # Misbehaving more often than the long soak, so that 20 s sees each kind.
        "soak": ["-m", "bench.cli", "soak", "--minutes", "0.33", "--warmup", "5", "--sample-every",
                 "2", "--misbehave", "0.15", "0.1", "0.1", "--query-pause", "0.05", "0.3"],
    }  # fmt: skip
    procs = {
        name: subprocess.Popen(
            [sys.executable, *args, "--out", str(tmp / f"{name}.json")],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for name, args in commands.items()
    }
    out: dict[str, Any] = {}
    try:
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=240)
            out[name] = {
                "rc": proc.returncode,
                "output": output.decode(errors="replace")[-4000:],
                "doc": orjson.loads((tmp / f"{name}.json").read_bytes()),
            }
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    yield out


def test_a_short_fuzz_leaves_the_broker_the_worker_and_a_real_client_unharmed(
    runs: dict[str, Any],
) -> None:
    fuzz = runs["fuzz"]
    result = fuzz["doc"]["result"]
    assert fuzz["rc"] == 0 and result["failures"] == [], fuzz["output"]
    assert result["frames_sent"] >= FUZZ_FRAMES
    assert result["alive_at_end"] == {"broker": True, "worker": True}
    assert result["legit_client"]["ok"] > 0 and result["legit_client"]["errors"] == 0
    dropped = result["broker_after"]["dropped_frames"] - result["broker_before"]["dropped_frames"]
    assert dropped >= result["must_drop"] > FUZZ_FRAMES // 2


def test_a_short_soak_has_no_unexpected_error_and_no_restart(runs: dict[str, Any]) -> None:
    soak = runs["soak"]
    summary = soak["doc"]["summary"]
    assert soak["rc"] == 0 and summary["failures"] == [], soak["output"]
    roles = {m["role"] for m in summary["memory"].values()}
    assert {"supervisor", "broker", "worker", "ingress"} <= roles
    assert summary["counts"]["ok"] > 0 and summary["counts"]["unexpected"] == 0
    assert summary["died"] == {} and summary["appeared"] == {} and summary["exit_code"] == 0

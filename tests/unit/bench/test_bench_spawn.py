"""``--spawn``: the flags reach ``mesh-launch --role all`` exactly as given."""

from __future__ import annotations

import sys

from bench.spawn import SpawnedMesh


def test_spawn_flags_pass_through_unchanged_after_the_bench_own() -> None:
    flags = "--ingress-procs 6 --workers 2 --model '/models/with space' --warmup-buckets 16,32"
    cmd = SpawnedMesh(flags).command(8123)
    assert cmd[:5] == [sys.executable, "-m", "launch.cli", "--role", "all"]
    assert "--auto-truncate" in cmd and cmd[cmd.index("--http-port") + 1] == "8123"
    assert cmd[-8:] == [
        "--ingress-procs", "6", "--workers", "2", "--model", "/models/with space",
        "--warmup-buckets", "16,32",
    ]  # fmt: skip


def test_describe_shows_the_command_line_the_configuration_was_started_with() -> None:
    mesh = SpawnedMesh("--ingress-procs 2")
    mesh.url = "http://127.0.0.1:8123/v1"
    mesh.line = "embedmesh serving m at http://127.0.0.1:8123/v1 (1 worker, cpu)"
    text = mesh.describe()
    assert text.startswith("mesh-launch --role all --http-port 8123 --auto-truncate")
    assert "--ingress-procs 2 -> embedmesh serving" in text


def test_without_a_started_mesh_there_is_no_broker_to_find() -> None:
    assert SpawnedMesh("").broker_frontend() is None

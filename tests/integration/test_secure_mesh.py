"""A mesh over TCP secured with keys made by ``mesh-launch --gen-keys``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launch.roles import Security, client_connector
from mesh.client import MeshClient
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers


async def test_curve_secured_mesh_serves_embeddings(tcp_mesh: Mesh, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    subprocess.run(
        [sys.executable, "-m", "launch.cli", "--gen-keys", str(keys)], check=True, timeout=60
    )
    assert (keys / "broker.key_secret").exists() and (keys / "worker.key").exists()
    tcp_mesh.start_broker("--curve-dir", str(keys))
    tcp_mesh.start_worker("--curve-dir", str(keys))
    connect = client_connector(Security(curve_dir=keys), "ingress")
    async with MeshClient(tcp_mesh.frontend, liveness=TEST_LIVENESS, connect=connect) as client:
        await wait_for_workers(client, 1)
        result = await client.embed(["secured by curve"], MODEL, timeout_s=30)
        assert result.embeddings.shape == (1, 384)


def test_broker_refuses_a_public_bind_without_keys(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.cli",
            "--role",
            "broker",
            "--frontend",
            "tcp://0.0.0.0:0",
            "--backend",
            f"ipc://{tmp_path}/back",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "--insecure" in proc.stderr and "--curve-dir" in proc.stderr

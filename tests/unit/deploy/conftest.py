"""The overlays of deploy/k8s rendered once per session, with throwaway secrets: the CurveZMQ
keys and the API key a user makes before ``kubectl apply -k`` (docs/deploy.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.transport import generate_keys
from tests.unit.deploy.k8s_objects import K8S, OVERLAYS


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlays cannot be rendered here")
    probe = subprocess.run([kubectl, "kustomize", "--help"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("this kubectl has no kustomize built in")
    return kubectl


@pytest.fixture(scope="session")
def k8s_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/k8s with the secrets filled in as the deploy guide says."""
    tree = tmp_path_factory.mktemp("deploy") / "k8s"
    shutil.copytree(K8S, tree)
    generate_keys(tree / "base" / "secrets" / "curve")
    (tree / "base" / "secrets" / "api-key").write_text("test-api-key\n")
    return tree


@pytest.fixture(scope="session")
def renders(k8s_tree: Path) -> dict[str, list[dict[str, Any]]]:
    """Overlay name -> the objects ``kubectl kustomize`` renders for it."""
    kubectl = _kubectl()
    out: dict[str, list[dict[str, Any]]] = {}
    for name in OVERLAYS:
        done = subprocess.run(
            [kubectl, "kustomize", str(k8s_tree / "overlays" / name)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"overlays/{name} does not render:\n{done.stderr}"
        out[name] = [o for o in yaml.safe_load_all(done.stdout) if o]
    return out

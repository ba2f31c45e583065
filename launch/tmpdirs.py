"""The launcher's private temp dirs: made with the owner's pid in the name; stale ones removed.

``mesh-launch --role all`` (and the parent of ``--ingress-procs N``) keeps its ipc:// endpoints
and the shared metrics in a private dir under the temp dir, removed when it exits. A launcher
killed with SIGKILL cannot remove it, so every dir is named ``embedmesh-[KIND-]PID-XXXXXXXX``
(PID: the process that made it) and a launcher starting removes those of its user whose
process no longer runs. A dir whose process runs is never touched (a recycled pid keeps a
stale dir until that process ends too: harmless), nor one of another user, nor a name without
a pid (made by an older version, which may still run).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("embedmesh.launch")

PREFIX = "embedmesh-"
# embedmesh-[kind-]PID-suffix; mkdtemp's suffixes are [a-z0-9_], never a '-'.
_NAME = re.compile(rf"^{PREFIX}(?:[a-z]+-)*(\d+)-[a-z0-9_]+$")


def private_dir(kind: str = "") -> Path:
    """A new private dir ``embedmesh-[KIND-]PID-XXXXXXXX`` under the temp dir, after removing
    the stale ones there."""
    remove_stale()
    name = f"{PREFIX}{kind + '-' if kind else ''}{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=name))


def owner_pid(path: Path) -> int | None:
    """The pid in a private dir's name; None for any other name."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def remove_stale(root: Path | None = None) -> list[Path]:
    """Remove the private dirs under ``root`` (the temp dir) that this user owns and whose
    process is gone; those removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    uid = os.getuid()
    for path in root.glob(f"{PREFIX}*"):
        pid = owner_pid(path)
        if pid is None or pid == os.getpid() or _running(pid):
            continue
        try:
            st = path.lstat()
        except OSError:
            continue  # gone meanwhile
        if not path.is_dir() or path.is_symlink() or st.st_uid != uid:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    if removed:
        log.info("removed %d temp dirs of launchers that are gone: %s", len(removed),
                 ", ".join(p.name for p in removed))  # fmt: skip
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True

"""mesh-embed's progress file: written atomically, and only for the run that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.embed_cli import progress
from mesh.embed_cli.errors import InputError


def test_a_saved_progress_loads_back_for_the_same_run(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "x"}\n')
    job = progress.job_of(source, model="m", dimensions=None)
    marker = progress.progress_path(tmp_path / "out.npy")
    assert marker.name == "out.npy.progress"
    progress.save(marker, progress.Progress(job, 7, {"dims": 384}))
    assert progress.load(marker, job) == progress.Progress(job, 7, {"dims": 384})
    assert not marker.with_name(marker.name + ".tmp").exists()


def test_progress_of_another_run_is_refused_naming_what_differs(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "x"}\n')
    marker = tmp_path / "out.npy.progress"
    progress.save(marker, progress.Progress(progress.job_of(source, model="m"), 1))
    with pytest.raises(InputError, match=r"another run \(model differ"):
        progress.load(marker, progress.job_of(source, model="other"))
    source.write_text('{"text": "x"}\n{"text": "y"}\n')  # the input changed under it
    with pytest.raises(InputError, match="size"):
        progress.load(marker, progress.job_of(source, model="m"))


def test_an_unreadable_progress_file_points_at_force(tmp_path: Path) -> None:
    marker = tmp_path / "out.npy.progress"
    marker.write_text("{half")
    with pytest.raises(InputError, match="unreadable progress file.*--force"):
        progress.load(marker, {})

"""The blob store: atomic writes, and an input cut into chunks by line with byte ranges."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.jobs.blobs import BlobStore
from mesh.jobs.store import ChunkSpan


def test_chunks_cover_every_line_once_with_its_bytes(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    lines = [b"a", b"bb", b"", b"dddd", b"e"]
    blobs.write("in", b"\n".join(lines))  # the last line has no newline
    spans = blobs.plan_chunks("in", 2)
    assert spans == [ChunkSpan(0, 2, 0, 5), ChunkSpan(2, 4, 5, 11), ChunkSpan(4, 5, 11, 12)]
    assert [line for s in spans for line in blobs.read_span("in", s)] == lines


def test_a_file_ending_in_a_newline_has_no_empty_last_line(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    blobs.write("in", b"x\ny\n")
    assert blobs.plan_chunks("in", 10) == [ChunkSpan(0, 2, 0, 4)]
    assert blobs.read_span("in", ChunkSpan(0, 2, 0, 4)) == [b"x", b"y"]
    blobs.write("empty", b"")
    assert blobs.plan_chunks("empty", 10) == []


def test_a_write_that_fails_leaves_no_blob_and_no_temporary(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    with pytest.raises(RuntimeError), blobs.writer("parts/b/0.1") as out:
        out.write(b"half")
        raise RuntimeError("killed mid-write")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert blobs.write("parts/b/0.1", b"whole") == 5
    assert blobs.path("parts/b/0.1").read_bytes() == b"whole"

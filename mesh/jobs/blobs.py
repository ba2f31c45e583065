"""File contents and output parts as plain files under one directory.

The directory is the state directory on one host, or a volume every host of a fleet mounts
(the database then holds only names). Every write lands under a temporary name and is renamed
into place, so a reader never sees half a blob and a writer killed mid-way leaves no blob.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from mesh.jobs.store import ChunkSpan, TooLarge

COPY_BYTES = 1 << 20


class BlobStore:
    """Blobs by relative name (``files/<file id>``, ``parts/<batch id>/<chunk>.<attempt>``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str, content: BinaryIO | bytes, *, max_bytes: int | None = None) -> int:
        """Store ``content`` under ``name``, atomically; returns its size in bytes."""
        with self.writer(name) as out:
            return _copy(content, out, max_bytes)

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        """A file to fill; it appears under ``name`` only when the block ends without error."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def open(self, name: str) -> BinaryIO:
        return self.path(name).open("rb")

    def delete(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def delete_tree(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)

    def read_span(self, name: str, span: ChunkSpan) -> list[bytes]:
        """The input lines of one chunk, without their newlines."""
        with self.open(name) as src:
            src.seek(span.byte_start)
            data = src.read(span.byte_end - span.byte_start)
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        return lines

    def plan_chunks(self, name: str, lines_per_chunk: int) -> list[ChunkSpan]:
        """Cut a JSONL blob into chunks of ``lines_per_chunk`` lines, streaming it once."""
        if lines_per_chunk < 1:
            raise ValueError("lines_per_chunk must be at least 1")
        spans: list[ChunkSpan] = []
        first_line = start = offset = 0
        line = 0
        for end in _line_ends(self.path(name)):
            line += 1
            offset = end
            if line - first_line == lines_per_chunk:
                spans.append(ChunkSpan(first_line, line, start, offset))
                first_line, start = line, offset
        if line > first_line:
            spans.append(ChunkSpan(first_line, line, start, offset))
        return spans


def _line_ends(path: Path) -> Iterator[int]:
    """Byte offset just past each line (past its newline; the file's end for a last bare line)."""
    base = 0
    tail = False
    with path.open("rb") as src:
        while block := src.read(COPY_BYTES):
            at = block.find(b"\n")
            while at >= 0:
                yield base + at + 1
                at = block.find(b"\n", at + 1)
            tail = not block.endswith(b"\n")
            base += len(block)
    if tail:
        yield base


def _copy(content: BinaryIO | bytes, out: BinaryIO, max_bytes: int | None) -> int:
    if isinstance(content, bytes | bytearray | memoryview):
        if max_bytes is not None and len(content) > max_bytes:
            raise TooLarge(f"file is {len(content)} bytes, over the limit of {max_bytes}")
        out.write(content)
        return len(content)
    size = 0
    while block := content.read(COPY_BYTES):
        size += len(block)
        if max_bytes is not None and size > max_bytes:
            raise TooLarge(f"file is over the limit of {max_bytes} bytes")
        out.write(block)
    return size

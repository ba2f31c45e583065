"""``--batch``'s request files: the input streamed into OpenAI Batch API JSONL files.

One line per input row, ``{"custom_id": "<row number>", "method": "POST", "url":
"/v1/embeddings", "body": {"model", "input", "encoding_format"[, "dimensions"]}}``. The
custom_id is the row's 0-based number, unique by construction whatever the id field holds
(ids may repeat or be numbers); the output puts each vector back on its row by it. A file is
closed before it would pass ``max_bytes`` or ``max_lines`` (OpenAI's limits: 200 MB and 50,000
requests a batch), and the next rows go to the next file: one batch each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from mesh.embed_cli.errors import InputError

ENDPOINT = "/v1/embeddings"
MAX_LINES = 50_000  # OpenAI: requests a batch
MAX_BYTES = 200 * 10**6  # OpenAI: an input file's size


@dataclass
class RequestFile:
    """Rows ``start`` to ``end`` (exclusive) as the request file ``path``."""

    index: int
    start: int
    end: int
    path: Path
    bytes: int


def request_line(row: int, text: str, body: dict[str, Any]) -> bytes:
    """One request of a batch input file, newline included."""
    doc = {
        "custom_id": str(row),
        "method": "POST",
        "url": ENDPOINT,
        "body": {**body, "input": text},
    }
    return orjson.dumps(doc) + b"\n"


def request_body(model: str, encoding_format: str, dimensions: int | None) -> dict[str, Any]:
    """The body every line shares, but for its ``input``."""
    body: dict[str, Any] = {"model": model, "encoding_format": encoding_format}
    if dimensions is not None:
        body["dimensions"] = dimensions
    return body


def write_request_files(
    rows: Iterable[tuple[int, str]],
    directory: Path,
    body: dict[str, Any],
    *,
    max_bytes: int = MAX_BYTES,
    max_lines: int = MAX_LINES,
    first_index: int = 0,
) -> Iterator[RequestFile]:
    """``(row number, text)`` rows as request files in ``directory``, each yielded once
    closed (so it can be uploaded while the next is written); rows must come in order."""
    out: BinaryIO | None = None
    current: RequestFile | None = None
    index = first_index
    try:
        for row, text in rows:
            line = request_line(row, text, body)
            if len(line) > max_bytes:
                raise InputError(f"row {row + 1}: its request alone is {len(line):,} bytes, "
                                 f"over --batch-file-bytes ({max_bytes:,})")  # fmt: skip
            full = current is not None and (
                current.bytes + len(line) > max_bytes or current.end - current.start >= max_lines
            )
            if current is not None and full:
                assert out is not None
                out.close()
                yield current
                current, index = None, index + 1
            if current is None:
                path = directory / f"requests-{index:05d}.jsonl"
                out, current = path.open("wb"), RequestFile(index, row, row, path, 0)
            assert out is not None
            out.write(line)
            current.end, current.bytes = row + 1, current.bytes + len(line)
        if current is not None:
            assert out is not None
            out.close()
            yield current
    finally:
        if out is not None and not out.closed:
            out.close()

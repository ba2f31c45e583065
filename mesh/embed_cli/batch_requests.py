"""``--batch``'s request files: the input streamed into OpenAI Batch API JSONL files.

One line per ``--batch-size`` rows (a request of that many texts, as the direct mode sends),
``{"custom_id": "<first row>-<row after the last>", "method": "POST", "url":
"/v1/embeddings", "body": {"model", "input", "encoding_format"[, "dimensions"]}}``; a line of
one row has that row's number alone as its custom_id. Row numbers count from 0 and are unique
by construction, whatever the id field holds (ids may repeat or be numbers); the output puts
each vector back on its row by them. A file is closed before it would pass ``max_bytes`` or
``max_rows`` rows (OpenAI's limits: 200 MB, and 50,000 embedding inputs a batch, which keeps
it under 50,000 requests too), and the next rows go to the next file: one batch each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from mesh.embed_cli.errors import InputError

ENDPOINT = "/v1/embeddings"
MAX_ROWS = 50_000  # OpenAI: embedding inputs (and requests) a batch
MAX_BYTES = 200 * 10**6  # OpenAI: an input file's size


@dataclass
class RequestFile:
    """Rows ``start`` to ``end`` (exclusive) as the request file ``path``."""

    index: int
    start: int
    end: int
    path: Path
    bytes: int


def custom_id(start: int, count: int) -> str:
    return str(start) if count == 1 else f"{start}-{start + count}"


def rows_of(custom: object) -> range:
    """The rows a custom_id of ours names; ValueError for any other."""
    if not isinstance(custom, str):
        raise ValueError(custom)
    first, dash, after = custom.partition("-")
    start = int(first)
    end = int(after) if dash else start + 1
    if start < 0 or end <= start or custom != custom_id(start, end - start):
        raise ValueError(custom)
    return range(start, end)


def request_line(start: int, texts: list[str], body: dict[str, Any]) -> bytes:
    """One request of a batch input file (rows ``start`` on), newline included."""
    doc = {
        "custom_id": custom_id(start, len(texts)),
        "method": "POST",
        "url": ENDPOINT,
        "body": {**body, "input": texts[0] if len(texts) == 1 else texts},
    }
    return orjson.dumps(doc) + b"\n"


def grouped(rows: Iterable[tuple[int, str]], size: int) -> Iterator[tuple[int, list[str]]]:
    """(first row, texts) of ``size`` consecutive rows at a time."""
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk[0][0], [text for _, text in chunk]


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
    max_rows: int = MAX_ROWS,
    first_index: int = 0,
    texts_per_line: int = 1,
) -> Iterator[RequestFile]:
    """``(row number, text)`` rows as request files in ``directory``, ``texts_per_line`` rows
    a request, each file yielded once closed (so it can be uploaded while the next is
    written); rows must come in order."""
    out: BinaryIO | None = None
    current: RequestFile | None = None
    index = first_index
    try:
        for row, texts in grouped(rows, texts_per_line):
            line = request_line(row, texts, body)
            if len(line) > max_bytes:
                raise InputError(f"rows {row + 1}-{row + len(texts)}: their request alone is "
                                 f"{len(line):,} bytes, over --batch-file-bytes ({max_bytes:,}); "
                                 "a smaller --batch-size helps")  # fmt: skip
            full = current is not None and (
                current.bytes + len(line) > max_bytes
                or current.end - current.start + len(texts) > max_rows
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
            current.end, current.bytes = row + len(texts), current.bytes + len(line)
        if current is not None:
            assert out is not None
            out.close()
            yield current
    finally:
        if out is not None and not out.closed:
            out.close()

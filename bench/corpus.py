"""The benchmark workload: texts from a JSON-lines corpus, grouped into request bodies."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
# data/corpus.jsonl in the repository (a copy of the shared corpus): 2,500 real English texts, 40 % queries.
DEFAULT_CORPUS = REPO / "data" / "corpus.jsonl"

# The body field by which a client picks the ingress's lane; without it the ingress
# picks by size (over 1,024 tokens: batch). One name here, should the ingress rename it.
PRIORITY_FIELD = "priority"
PRIORITIES = ("interactive", "batch")


def load_texts(path: str | Path = DEFAULT_CORPUS, kind: str | None = None) -> list[str]:
    """The ``text`` of every line of a JSON-lines file (only lines of ``kind``, if given)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus {path} not found (JSON lines with a 'text' field)")
    texts = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "text" not in row:
                raise ValueError(f"{path}:{n}: no 'text' field")
            if kind is None or row.get("kind") == kind:
                texts.append(str(row["text"]))
    if not texts:
        raise ValueError(f"{path}: no texts" + (f" of kind {kind!r}" if kind else ""))
    return texts


def request_bodies(
    texts: list[str],
    model: str,
    texts_per_request: int,
    encoding_format: str = "float",
    priority: str | None = None,
) -> list[tuple[bytes, int]]:
    """One pass over ``texts`` as ``(JSON body, number of texts)`` pairs, serialized once;
    with ``priority``, each body names its lane.

    Pre-serializing keeps the load generator's own CPU per request small: it shares the
    machine with the mesh it measures.
    """
    if texts_per_request < 1:
        raise ValueError("texts_per_request must be at least 1")
    if priority is not None and priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}")
    bodies = []
    for i in range(0, len(texts), texts_per_request):
        chunk = texts[i : i + texts_per_request]
        body = {
            "model": model,
            "input": chunk[0] if len(chunk) == 1 else chunk,
            "encoding_format": encoding_format,
        }
        if priority is not None:
            body[PRIORITY_FIELD] = priority
        bodies.append((orjson.dumps(body), len(chunk)))
    return bodies

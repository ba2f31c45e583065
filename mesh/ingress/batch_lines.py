"""A batch's input file checked line by line (validation), and one line run as the
``/v1/embeddings`` request it holds, into its output or error line.

Validation fails the whole batch (OpenAI's ``errors`` list, 1-based line numbers) when a line
is not a JSON object, lacks a ``custom_id``, repeats one, or names another method or route
than the batch's endpoint. A line whose ``body`` is wrong is not a validation failure: it is
answered as the same request to ``/v1/embeddings`` would be (a 4xx) in the error file, and
the batch goes on. A failure of the mesh (429, 502, 503, 504) is no answer about the line: it
is retried, and past the retries it fails the chunk (the store runs it again later); except
a 502 ``worker_failed``, the workers' repeated deaths on this very line: that is its answer.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import orjson

from mesh.errors import MeshError
from mesh.ingress.bodies import from_doc
from mesh.ingress.embeddings import embed
from mesh.ingress.http_errors import ApiError, error_body
from mesh.ingress.schema import EmbeddingsRequest
from mesh.ingress.state import IngressState
from mesh.jobs import BatchError, LineResult
from proto_msgs import ErrorCode, Lane

MAX_ERRORS = 20  # validation errors reported at most; the first ones, in line order
CHARS_PER_TOKEN = 4  # the token estimate of a text before it is tokenized (English BPE ~4)
RETRY_STATUSES = frozenset({429, 502, 503, 504})  # the mesh's failures, not the line's
# ... but for this one: the broker already gave the line its attempts, each one a worker lost
# on it (a poison input), and every try more would cost that many workers again.
LINE_FAULT = "worker_failed"
LINE_RETRIES = 6  # tries of a line the mesh fails, backing off 1, 2, 4, 8, 8 s between
# The mesh could not take the line at all (no worker serves its model now, no room): the
# chunk is given back without spending one of its attempts.
UNAVAILABLE_STATUSES = frozenset({429, 503})


class ChunkFailed(Exception):
    """The mesh kept failing a line: the chunk is given back for a later attempt.
    ``unavailable``: the mesh never took it (``UNAVAILABLE_STATUSES``), so the attempt is not
    the line's to count."""

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


def validate(lines: Iterator[bytes], endpoint: str) -> tuple[list[BatchError], int, int]:
    """The file's errors (none: valid), its estimated tokens and its inputs (texts, or
    token-id lists)."""
    errors: list[BatchError] = []
    seen: set[str] = set()
    tokens = inputs = 0
    count = 0
    for count, raw in enumerate(lines, 1):
        problem, custom_id, body = _check_line(raw, endpoint)
        if problem is None and custom_id in seen:
            problem = BatchError("duplicate_custom_id", f"custom_id {custom_id!r} is repeated")
        if problem is not None:
            if len(errors) < MAX_ERRORS:
                errors.append(BatchError(problem.code, problem.message, count, problem.param))
            continue
        seen.add(custom_id)
        tokens += estimate_tokens(body)
        inputs += count_inputs(body)
    if count == 0:
        errors.append(BatchError("empty_file", "the input file has no lines"))
    return errors, tokens, inputs


def _check_line(raw: bytes, endpoint: str) -> tuple[BatchError | None, str, Any]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return BatchError("invalid_json_line", "the line is not valid JSON (JSONL: one "
                          "request object a line)"), "", None  # fmt: skip
    if not isinstance(doc, dict):
        return BatchError("invalid_json_line", "the line is not a JSON object"), "", None
    custom_id = doc.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchError("missing_required_parameter", "the line has no custom_id string",
                          param="custom_id"), "", None  # fmt: skip
    if doc.get("method") != "POST":
        return BatchError("invalid_method", "the line's method must be POST",
                          param="method"), custom_id, None  # fmt: skip
    if doc.get("url") != endpoint:
        return BatchError("mismatched_endpoint", f"the line's url is {doc.get('url')!r}; this "
                          f"batch's endpoint is {endpoint}", param="url"), custom_id, None  # fmt: skip
    return None, custom_id, doc.get("body")


def count_inputs(body: Any) -> int:
    """How many embeddings a body asks for (one text, a list of texts or of id lists, or
    one list of token ids)."""
    value = body.get("input") if isinstance(body, dict) else None
    if not isinstance(value, list) or not value or all(type(t) is int for t in value):
        return 1
    return len(value)


def estimate_tokens(body: Any) -> int:
    """About how many tokens a body's ``input`` holds (texts: characters / 4)."""
    value = body.get("input") if isinstance(body, dict) else None
    items = value if isinstance(value, list) else [value]
    if items and all(type(t) is int for t in items):
        return len(items)  # one list of token ids
    total = 0
    for item in items:
        if isinstance(item, str):
            total += len(item) // CHARS_PER_TOKEN + 2
        elif isinstance(item, list):
            total += len(item)
    return total


async def run_line(state: IngressState, line_no: int, raw: bytes) -> LineResult:
    """One validated line through the route's own path, always on the batch lane."""
    doc = orjson.loads(raw)
    custom_id = doc["custom_id"]
    request_id = "req_" + secrets.token_hex(12)
    for attempt in range(LINE_RETRIES):
        try:
            body, tokens = await _embed(state, doc.get("body"))
        except ApiError as err:
            if err.status not in RETRY_STATUSES or err.code == LINE_FAULT:
                return _line(line_no, custom_id, request_id, err.status, error_body(err), ok=False)
            failure = err
        else:
            return _line(line_no, custom_id, request_id, 200, orjson.Fragment(body), tokens=tokens)
        if attempt + 1 < LINE_RETRIES:
            await asyncio.sleep(max(failure.retry_after_s or 0.0, min(2.0**attempt, 8.0)))
    raise ChunkFailed(
        f"line {line_no + 1} ({custom_id}): {failure}",
        unavailable=failure.status in UNAVAILABLE_STATUSES,
    )


async def _embed(state: IngressState, body: Any) -> tuple[bytes, int]:
    try:
        if not isinstance(body, dict):
            raise ApiError.malformed("the line's 'body' must be a JSON object")
        req = from_doc(EmbeddingsRequest, body, state.cfg.max_inputs)
        req.priority = Lane.BATCH  # a job never delays a live query
        done = await embed(state, req, time.perf_counter())
    except MeshError as exc:
        if exc.code is ErrorCode.MODEL_NOT_FOUND and not state.client.models():
            # The catalog is gone (every broker lost): no answer about the line's model.
            raise ApiError(503, exc.message, "server_error", "unavailable") from None
        raise ApiError.from_mesh(exc) from None
    return done.body, done.result.prompt_tokens


def _line(
    line_no: int, custom_id: str, request_id: str, status: int, body: object, *, ok: bool = True,
    tokens: int = 0,
) -> LineResult:  # fmt: skip
    doc = {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }
    data = orjson.dumps(doc)
    if ok:
        return LineResult(line_no, custom_id, output=data, tokens=tokens)
    return LineResult(line_no, custom_id, error=data)

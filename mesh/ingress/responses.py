"""The bytes an ingress process holds for responses: bounded per response and across all.

A small request can ask for a large answer: 170 inputs to ``/embed_all`` are 263 KB of body
and, as JSON floats, about 200 MB of response. The size of an embedding response is known once
the request is tokenized (rows x width x the bytes of one value in its format), before any
work is sent to the mesh, so it is checked then:

- over ``--max-response-bytes`` (one response): **413** ``request_too_large``, saying the
  bound, the estimate and how many of the inputs would fit (and, for ``float``, that
  ``base64`` is about a third of the size);
- over what is left of ``--response-budget-bytes`` (every response this process is building
  or sending at once): **429** ``overloaded`` with ``Retry-After: 1``; the budget frees as
  responses are sent.

A request's reservation is held from this check until its response has been written to the
connection (or the client went away): the handler's task, which also writes the response.

The estimate is an upper bound of the body: a ``float`` value is counted as FLOAT_TEXT_BYTES
(orjson writes a float32 in at most 9 significant digits: ``-0.012345679,`` or
``-1.2345679e-5,``), a base64 value as its encoded bytes, plus ROW_OVERHEAD per row for the
keys around it.
"""

from __future__ import annotations

import asyncio
import math

from mesh.client import ValidRequest
from mesh.ingress.http_errors import ApiError

FLOAT_TEXT_BYTES = 14  # one float32 as JSON text, its separator included, at most
ROW_OVERHEAD = 64  # '{"object":"embedding","index":2047,"embedding":[...]},' and the like
# float32, int8 and binary (one bit per dimension) values, in bytes
RAW_BYTES = {"float32": 4.0, "float16": 2.0, "int8": 1.0, "binary": 0.125}


def row_bytes(width: int, kind: str, encoding_format: str) -> int:
    """The most bytes one row of ``width`` values takes in the response: JSON numbers for
    ``float``, base64 of the raw bytes for the ``base64*`` formats."""
    if encoding_format == "float":
        return width * FLOAT_TEXT_BYTES + ROW_OVERHEAD
    raw = math.ceil(width * RAW_BYTES.get(kind, 4.0))
    return 4 * math.ceil(raw / 3) + ROW_OVERHEAD


def answer_width(valid: ValidRequest) -> int:
    """Values per row of ``valid``'s answer: a multi-vector head's width; span rows (token
    states of ``/embed_all``, chunk means) the hidden width, before any Dense layer; pooled
    rows the model's dimensions; either cut by a Matryoshka ``dimensions``."""
    output, model = valid.output, valid.model
    if output.rows == "multivector":
        return model.multivector_dims
    if output.rows == "spans":
        return output.dims or model.hidden_size or model.dims
    return output.dims or model.dims


class ResponseBudget:
    """Bytes reserved by the responses of one process (see the module docstring)."""

    def __init__(self, process_bytes: int, response_bytes: int) -> None:
        self.process_bytes = process_bytes
        # A response larger than the whole budget could never be admitted: the smaller bound.
        self.response_bytes = min(response_bytes, process_bytes)
        self.held = 0

    def reserve(self, valid: ValidRequest, encoding_format: str) -> int:
        """Reserve the bytes of ``valid``'s answer until the current task (the request's
        handler, which also writes the response) ends; the bytes. ApiError 413 or 429."""
        size = valid.rows * row_bytes(answer_width(valid), valid.output.kind, encoding_format)
        if size > self.response_bytes:
            raise ApiError.too_large(self._too_large(valid, size, encoding_format))
        if self.held + size > self.process_bytes:
            raise ApiError(
                429,
                f"this server is busy sending other large responses (about {self.held} of its "
                f"{self.process_bytes} bytes are reserved, this one needs {size}); retry",
                "rate_limit_error",
                "overloaded",
                retry_after_s=1.0,
            )
        self.held += size
        task = asyncio.current_task()
        assert task is not None
        task.add_done_callback(lambda _: self._release(size))
        return size

    def _release(self, size: int) -> None:
        self.held -= size

    def _too_large(self, valid: ValidRequest, size: int, encoding_format: str) -> str:
        fit = valid.n * self.response_bytes // size  # inputs alike in size
        hint = (
            "; base64 is about a third of the size of float" if encoding_format == "float" else ""
        )
        return (
            f"the response would be about {size} bytes, over this server's limit of "
            f"{self.response_bytes} bytes per response (--max-response-bytes): about {fit} of "
            f"these {valid.n} inputs fit in one request{hint}"
        )

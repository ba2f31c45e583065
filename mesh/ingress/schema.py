"""``POST /v1/embeddings``'s body, declared once (``mesh.ingress.bodies``), and what the
OpenAI-shaped routes share with it: the ``priority`` field and header, ``encoding_format``,
``dimensions``, the inputs as texts or token ids.

The checks that need no catalog happen here (shape, types, emptiness, counts, enum values);
those that need the model (``dimensions`` range, token limit, vocabulary) happen once, in the
client's front door (``mesh.client.request``), once the model is resolved. Status codes follow
``mesh.ingress.http_errors``: 400 unreadable, 422 invalid, 413 too many inputs.

``priority`` (``"interactive"`` | ``"batch"``) picks the lane explicitly; so does the
``X-Embedmesh-Priority`` header (the body wins when both are given). Without either, the lane
follows the request's size.

``prompt_name`` (an extension, as TEI takes it) names one of the model's sentence-transformers
prompts (``GET /v1/models/{model}`` lists them), whose text is put before every input text;
without it the model's default prompt applies, if it has one. Token-id input is embedded as
given: a ``prompt_name`` with it is a 422, as is a name the model does not have.

``truncate`` (TEI's field, taken here too): true cuts inputs over the model's limit, false
refuses them (422); absent, the server's ``--auto-truncate`` decides. ``user`` is OpenAI's and
is accepted and ignored; other unknown fields are ignored, as the route's description says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from mesh.ingress.bodies import (
    Choice,
    Flag,
    Integer,
    Schema,
    Shaped,
    Text,
    decode,
    field,
    json_type,
)
from mesh.ingress.encodings import ENCODINGS
from mesh.ingress.http_errors import ApiError
from proto_msgs import Lane

__all__ = ["EmbeddingsRequest", "Inputs", "json_type", "parse_embeddings_request"]

PRIORITY_HEADER = "X-Embedmesh-Priority"
# The values of the body's ``priority`` and of the header: the lane each asks for.
PRIORITIES: dict[str, Lane] = {"interactive": Lane.INTERACTIVE, "batch": Lane.BATCH}


@dataclass(slots=True)
class Inputs:
    """A request's inputs as texts or as token id lists (concatenated, with offsets), never
    both."""

    texts: list[str] | None = None
    token_ids: np.ndarray | None = None  # int64, all sequences concatenated
    offsets: np.ndarray | None = None  # int64, n + 1 entries

    @property
    def n(self) -> int:
        if self.texts is not None:
            return len(self.texts)
        assert self.offsets is not None
        return len(self.offsets) - 1

    @property
    def chars(self) -> int:
        """TEI's ``x-compute-characters``: characters of texts, or the number of ids."""
        if self.texts is not None:
            return sum(map(len, self.texts))
        assert self.token_ids is not None
        return len(self.token_ids)


def _input_schema(max_inputs: int) -> Schema:
    text = {"type": "string", "minLength": 1}
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    many = {"minItems": 1, "maxItems": max_inputs}
    return {
        "oneOf": [text, {"type": "array", "items": text, **many}, ids,
                  {"type": "array", "items": ids, **many}],
        "description": "A text, texts, a list of token ids or lists of token ids.",
    }  # fmt: skip


def _parse_input(value: Any, name: str, max_inputs: int) -> Inputs:
    if isinstance(value, str):
        if not value:
            raise ApiError.invalid("'input' must not be an empty string", "input")
        return Inputs(texts=[value])
    if not isinstance(value, list):
        raise ApiError.invalid(
            "'input' must be a string, a list of strings, a list of token ids or a list of "
            "lists of token ids",
            "input",
        )
    if not value:
        raise ApiError.invalid("'input' must not be an empty list", "input")
    first = value[0]
    if isinstance(first, str):
        return Inputs(texts=_texts(value, max_inputs))
    if type(first) is int:
        return Inputs(*_token_lists([value], max_inputs, nested=False))
    if isinstance(first, list):
        return Inputs(*_token_lists(value, max_inputs, nested=True))
    raise ApiError.invalid(
        f"input[0] must be a string, a token id or a list of token ids; got {json_type(first)}",
        "input",
    )


def _check_count(n: int, max_inputs: int) -> None:
    if n > max_inputs:
        raise ApiError.too_large(
            f"{n} inputs in one request; at most {max_inputs} are allowed", "input"
        )


def _texts(items: list[object], max_inputs: int) -> list[str]:
    _check_count(len(items), max_inputs)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ApiError.invalid(
                f"input[{i}] is {json_type(item)}; a list of strings must hold only strings",
                "input",
            )
        if not item:
            raise ApiError.invalid(f"input[{i}] is an empty string", "input")
    return items  # type: ignore[return-value]


def _token_lists(
    seqs: list[object], max_inputs: int, *, nested: bool
) -> tuple[None, np.ndarray, np.ndarray]:
    _check_count(len(seqs), max_inputs)
    lengths = np.zeros(len(seqs), dtype=np.int64)
    for i, seq in enumerate(seqs):
        where = f"input[{i}]" if nested else "input"
        if not isinstance(seq, list):
            raise ApiError.invalid(
                f"{where} is {json_type(seq)}; a list of token lists must hold only lists",
                "input",
            )
        if not seq:
            raise ApiError.invalid(f"{where} is an empty list of token ids", "input")
        # type() rather than isinstance: JSON true/false must not pass as ids 1/0.
        if not all(type(t) is int for t in seq):
            raise ApiError.invalid(f"{where} must hold only integer token ids", "input")
        lengths[i] = len(seq)
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    try:
        ids = np.fromiter(
            (t for seq in seqs for t in seq),  # type: ignore[union-attr]
            dtype=np.int64,
            count=int(offsets[-1]),
        )
    except OverflowError:
        raise ApiError.invalid("token ids must fit in 64 bits", "input") from None
    return None, ids, offsets


ENCODING = Choice({name: name for name in ENCODINGS})
PRIORITY = Choice(PRIORITIES)
PRIORITY_TEXT = (
    f"The lane of every queue on the path; the {PRIORITY_HEADER} header does the same, the "
    "body wins. Without either, requests over 1024 tokens go to the batch lane."
)
DIMENSIONS = Integer(minimum=1)
DIMENSIONS_TEXT = (
    "Keep the first d components (Matryoshka), renormalized; at most the model's width "
    "(422 beyond)."
)
PROMPT_NAME_TEXT = (
    "One of the model's sentence-transformers prompts (GET /v1/models/{model} lists them), put "
    "before every input text; text input only. Absent: the model's default."
)
TRUNCATE_TEXT = "Cut inputs over the model's limit; absent: the server's --auto-truncate."


@dataclass
class EmbeddingsRequest:
    """One ``/v1/embeddings`` body, declared once: decoded and checked by
    :func:`mesh.ingress.bodies.decode`, described by ``schema_of``."""

    DESCRIPTION = "OpenAI's embeddings body, plus prompt_name, priority and truncate (TEI's)."

    model: str = field(Text(), required=True, description="A served name or an alias.")
    input: Inputs = field(Shaped(_parse_input, _input_schema), required=True)
    user: str | None = field(Text(min_length=0), description="Accepted, ignored.")
    encoding_format: str = field(ENCODING, default="float")
    dimensions: int | None = field(DIMENSIONS, description=DIMENSIONS_TEXT)
    priority: Lane | None = field(PRIORITY, description=PRIORITY_TEXT)
    prompt_name: str | None = field(Text(), description=PROMPT_NAME_TEXT)
    truncate: bool | None = field(Flag(), description=TRUNCATE_TEXT)

    def __post_init__(self) -> None:
        if self.prompt_name is not None and self.input.texts is None:
            raise ApiError.invalid(
                "'prompt_name' applies to text input only; token ids are embedded as given",
                "prompt_name",
            )

    @property
    def lane(self) -> Lane | None:
        """The client's choice of lane (the body's, else the header's); None: by size."""
        return self.priority

    @property
    def texts(self) -> list[str] | None:
        return self.input.texts

    @property
    def token_ids(self) -> np.ndarray | None:
        return self.input.token_ids

    @property
    def offsets(self) -> np.ndarray | None:
        return self.input.offsets

    @property
    def n_inputs(self) -> int:
        return self.input.n


T = TypeVar("T")


def decode_prioritized(
    cls: type[T], body: bytes, max_inputs: int, priority_header: str | None
) -> T:
    """``decode`` a body with a ``priority`` field; where it names none, the header's lane
    (the body wins when both are given)."""
    request: Any = decode(cls, body, max_inputs)
    if request.priority is None:
        request.priority = header_lane(priority_header)
    return request


def parse_embeddings_request(
    body: bytes, max_inputs: int, priority_header: str | None = None
) -> EmbeddingsRequest:
    return decode_prioritized(EmbeddingsRequest, body, max_inputs, priority_header)


def header_lane(header_value: str | None) -> Lane | None:
    """The lane the ``X-Embedmesh-Priority`` header asks for (routes without a body field)."""
    if header_value is None:
        return None
    value = header_value.strip().lower()
    if value not in PRIORITIES:
        raise ApiError.invalid(
            f"the {PRIORITY_HEADER} header must be one of {', '.join(PRIORITIES)}; got {value!r}",
            PRIORITY_HEADER,
        )
    return PRIORITIES[value]

"""``POST /v1/embeddings`` bodies: parsed and checked by hand, without a model-validation layer.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from mesh.ingress.encodings import ENCODINGS
from mesh.ingress.http_errors import ApiError
from proto_msgs import Lane

PRIORITY_HEADER = "X-Embedmesh-Priority"
# The values of the body's ``priority`` and of the header: the lane each asks for.
PRIORITIES: dict[str, Lane] = {"interactive": Lane.INTERACTIVE, "batch": Lane.BATCH}


@dataclass
class EmbeddingsRequest:
    """One request, with its inputs either as texts or as token ids (never both)."""

    model: str
    encoding_format: str  # a key of ENCODINGS
    dimensions: int | None
    lane: Lane | None = None  # the client's choice; None: by size
    texts: list[str] | None = None
    token_ids: np.ndarray | None = None  # int64, all sequences concatenated
    offsets: np.ndarray | None = None  # int64, n + 1 entries
    prompt_name: str | None = None  # one of the model's prompts; None: its default, if any

    @property
    def n_inputs(self) -> int:
        if self.texts is not None:
            return len(self.texts)
        assert self.offsets is not None
        return len(self.offsets) - 1


def parse_embeddings_request(
    body: bytes, max_inputs: int, priority_header: str | None = None
) -> EmbeddingsRequest:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError.malformed(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError.malformed("the body must be a JSON object")
    model = doc.get("model")
    if model is None:
        raise ApiError.invalid("'model' is required", "model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("'model' must be a non-empty string", "model")
    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError.invalid("'user' must be a string", "user")
    request = EmbeddingsRequest(
        model=model,
        encoding_format=_encoding_format(doc.get("encoding_format")),
        dimensions=_dimensions(doc.get("dimensions")),
        lane=_lane(doc.get("priority"), priority_header),
        prompt_name=_prompt_name(doc.get("prompt_name")),
    )
    if "input" not in doc:
        raise ApiError.invalid("'input' is required", "input")
    _parse_input(doc["input"], request, max_inputs)
    if request.prompt_name is not None and request.texts is None:
        raise ApiError.invalid(
            "'prompt_name' applies to text input only; token ids are embedded as given",
            "prompt_name",
        )
    return request


@dataclass
class CommonFields:
    """What the OpenAI-shaped routes other than ``/v1/embeddings`` share with it (model,
    encoding, dimensions, lane), and the body object for their own fields."""

    doc: dict[str, object]
    model: str
    encoding_format: str
    dimensions: int | None
    lane: Lane | None


def parse_common(
    body: bytes, priority_header: str | None, default_encoding: str = "float"
) -> CommonFields:
    """Parse a JSON object body and its common fields, with this module's statuses."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError.malformed(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError.malformed("the body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("'model' is required, a non-empty string", "model")
    encoding = doc.get("encoding_format")
    return CommonFields(
        doc=doc,
        model=model,
        encoding_format=_encoding_format(default_encoding if encoding is None else encoding),
        dimensions=_dimensions(doc.get("dimensions")),
        lane=_lane(doc.get("priority"), priority_header),
    )


def _prompt_name(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ApiError.invalid("'prompt_name' must be a non-empty string", "prompt_name")
    return value


def _encoding_format(value: object) -> str:
    if value is None:
        return "float"
    if not isinstance(value, str) or value not in ENCODINGS:
        raise ApiError.invalid(
            f"'encoding_format' must be one of {', '.join(ENCODINGS)}; got {value!r}",
            "encoding_format",
        )
    return value


def header_lane(header_value: str | None) -> Lane | None:
    """The lane the ``X-Embedmesh-Priority`` header asks for (routes without a body field)."""
    return _lane(None, header_value)


def _lane(body_value: object, header_value: str | None) -> Lane | None:
    if body_value is not None:
        return _priority(body_value, "'priority'", "priority")
    if header_value is not None:
        return _priority(header_value.strip().lower(), f"the {PRIORITY_HEADER} header", None)
    return None


def _priority(value: object, where: str, param: str | None) -> Lane:
    if not isinstance(value, str) or value not in PRIORITIES:
        raise ApiError.invalid(
            f"{where} must be one of {', '.join(PRIORITIES)}; got {value!r}",
            param or PRIORITY_HEADER,
        )
    return PRIORITIES[value]


def _dimensions(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int:  # bool is an int subclass; 3.0 is not an integer here
        raise ApiError.invalid("'dimensions' must be an integer", "dimensions")
    if value < 1:
        raise ApiError.invalid(f"'dimensions' must be at least 1; got {value}", "dimensions")
    return value


def _parse_input(value: object, request: EmbeddingsRequest, max_inputs: int) -> None:
    if isinstance(value, str):
        if not value:
            raise ApiError.invalid("'input' must not be an empty string", "input")
        request.texts = [value]
        return
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
        request.texts = _texts(value, max_inputs)
    elif type(first) is int:
        request.token_ids, request.offsets = _token_lists([value], max_inputs, nested=False)
    elif isinstance(first, list):
        request.token_ids, request.offsets = _token_lists(value, max_inputs, nested=True)
    else:
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
) -> tuple[np.ndarray, np.ndarray]:
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
    return ids, offsets


def json_type(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)

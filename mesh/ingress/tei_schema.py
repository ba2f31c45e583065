"""Bodies of TEI's routes (``POST /``, ``/embed``, ``/embed_sparse``, ``/embed_all``,
``/embed_multivector``, ``/tokenize``, ``/decode``, ``/rerank``, ``/predict``), each declared
once (``mesh.ingress.bodies``): what needs no catalog is checked here, the rest once in the
client's front door.

The shapes are TEI's (``router/src/http/types.rs``): ``inputs`` is a string, a list of token
ids, or a list of either; unknown fields are ignored, as serde does. Errors are ``ApiError``s
rendered in TEI's shape by ``http_errors``: an empty ``inputs`` (list, string or id list) is
TEI's 400 ``Empty``, a wrong value 422 ``Validation``, more inputs than ``--max-inputs`` (TEI's
``max_client_batch_size``) 413. ``prompt_name`` names one of the model's sentence-transformers
prompts, checked by the front door (without it the model's default prompt applies, as in TEI);
with token-id input it is a 422 (TEI decodes and re-tokenizes the ids, we embed them as given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mesh.ingress.bodies import (
    Choice,
    Flag,
    Integer,
    Number,
    Schema,
    Shaped,
    Text,
    decode,
    field,
    json_type,
)
from mesh.ingress.http_errors import ApiError
from mesh.ingress.schema import DIMENSIONS, DIMENSIONS_TEXT, PROMPT_NAME_TEXT, TRUNCATE_TEXT
from mesh.ingress.schema import Inputs as TeiInputs

# TEI's token ids are u32: larger or negative ids fail its parsing (422).
MAX_TOKEN_ID = 2**32 - 1
# serde accepts the variant's name and these aliases.
DIRECTIONS = {"Right": "right", "right": "right", "Left": "left", "left": "left"}

TEXT: Schema = {"type": "string", "minLength": 1}
TOKEN_IDS: Schema = {
    "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID},
    "minItems": 1,
}  # fmt: skip


def many(items: Schema, max_inputs: int) -> Schema:
    return {"type": "array", "items": items, "minItems": 1, "maxItems": max_inputs}


def _counted(items: list[Any], max_inputs: int, name: str) -> list[Any]:
    if not items:
        raise ApiError.empty(f"'{name}' cannot be empty", name)
    if len(items) > max_inputs:
        raise ApiError.too_large(
            f"batch size {len(items)} > maximum allowed batch size {max_inputs}", name
        )
    return items


def _not_empty_texts(texts: list[str]) -> None:
    for i, text in enumerate(texts):
        if not text:
            where = f"inputs[{i}]" if len(texts) > 1 else "'inputs'"
            raise ApiError.empty(f"{where} cannot be empty", "inputs")


def _inputs(value: Any, name: str, max_inputs: int) -> TeiInputs:
    """TEI's ``Input``: one ``InputType`` (a string or a list of ids) or a list of them."""
    if isinstance(value, str):
        _not_empty_texts([value])
        return TeiInputs(texts=[value])
    if not isinstance(value, list):
        raise ApiError.invalid(
            "'inputs' must be a string, a list of token ids or a list of either", "inputs"
        )
    if value and all(type(v) is int for v in value):
        return _token_inputs([value], nested=False)
    items = _counted(value, max_inputs, "inputs")
    if all(isinstance(v, str) for v in items):
        _not_empty_texts(items)
        return TeiInputs(texts=items)
    if all(isinstance(v, list) for v in items):
        return _token_inputs(items, nested=True)
    kinds = sorted({json_type(v) for v in items})
    raise ApiError.invalid(
        "'inputs' must be all strings or all lists of token ids (mixing them in one request "
        f"is not supported here); got {', '.join(kinds)}",
        "inputs",
    )


def _inputs_schema(max_inputs: int) -> Schema:
    return {
        "oneOf": [TEXT, TOKEN_IDS, many(TEXT, max_inputs), many(TOKEN_IDS, max_inputs)],
        "description": "A text, a list of token ids, or a list of either (one kind per request).",
    }


def _token_inputs(seqs: list[list], *, nested: bool) -> TeiInputs:
    lengths = np.zeros(len(seqs), dtype=np.int64)
    for i, seq in enumerate(seqs):
        where = f"inputs[{i}]" if nested else "'inputs'"
        if not seq:
            raise ApiError.empty(f"{where} cannot be empty", "inputs")
        if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in seq):
            raise ApiError.invalid(
                f"{where} must hold token ids from 0 to {MAX_TOKEN_ID}", "inputs"
            )
        lengths[i] = len(seq)
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter((t for seq in seqs for t in seq), dtype=np.int64, count=int(offsets[-1]))
    return TeiInputs(token_ids=ids, offsets=offsets)


INPUTS = Shaped(_inputs, _inputs_schema)
DIRECTION = Choice(DIRECTIONS)
PROMPT_ONLY_TEXT = "'prompt_name' applies to text input only; token ids are embedded as given"


@dataclass
class TeiInputsBody:
    """What TEI's embedding routes share: ``inputs``, ``truncate``, ``truncation_direction``,
    ``prompt_name``."""

    inputs: TeiInputs = field(INPUTS, required=True)
    truncate: bool | None = field(Flag(), description=TRUNCATE_TEXT)
    truncation_direction: str = field(DIRECTION, default="Right")
    prompt_name: str | None = field(Text(), description=PROMPT_NAME_TEXT)

    def __post_init__(self) -> None:
        if self.prompt_name is not None and self.inputs.texts is None:
            raise ApiError.invalid(PROMPT_ONLY_TEXT, "prompt_name")

    @property
    def direction(self) -> str:
        """``"right"`` or ``"left"``."""
        return self.truncation_direction

    def options(self) -> dict[str, Any]:
        """The client's output options this body asks for (``MeshClient.prepare_texts``)."""
        return {"dims": None, "normalize": True}


@dataclass
class EmbedRequest(TeiInputsBody):
    DESCRIPTION = "TEI's EmbedRequest."

    normalize: bool = field(Flag(), default=True)
    dimensions: int | None = field(DIMENSIONS, description=DIMENSIONS_TEXT)

    def options(self) -> dict[str, Any]:
        return {"dims": self.dimensions, "normalize": self.normalize}


@dataclass
class SparseRequest(TeiInputsBody):
    """TEI's ``POST /embed_sparse``: ``inputs``, ``truncate``, ``truncation_direction``,
    ``prompt_name`` as ``/embed`` takes them (no ``normalize`` or ``dimensions``), plus ours:
    ``top_k`` and ``threshold``."""

    DESCRIPTION = "TEI's EmbedSparseRequest, plus top_k and threshold."

    top_k: int | None = field(
        Integer(minimum=1),
        description="At most this many (index, value) pairs per input, the largest; at most the "
        "model's vocabulary size. Absent: every non-zero weight, as TEI (a request whose answer "
        "could be over GET /info's max_embed_sparse_pairs is 413: set top_k or send fewer "
        "inputs).",
    )
    threshold: float = field(
        Number(0.0), default=0, description="Keep only weights over this value."
    )

    def options(self) -> dict[str, Any]:
        return {"kind": "sparse", "top_k": self.top_k, "threshold": self.threshold,
                "dims": None, "normalize": False}  # fmt: skip


def _texts(value: Any, name: str, max_inputs: int) -> list[str]:
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        texts = _counted(value, max_inputs, "inputs")
    else:
        raise ApiError.invalid("'inputs' must be a string or a list of strings", "inputs")
    _not_empty_texts(texts)
    return texts


@dataclass
class TokenizeRequest:
    DESCRIPTION = "TEI's TokenizeRequest."

    inputs: list[str] = field(
        Shaped(_texts, lambda m: {"oneOf": [TEXT, many(TEXT, m)]}), required=True
    )
    add_special_tokens: bool = field(Flag(), default=True)
    prompt_name: str | None = field(Text(), description=PROMPT_NAME_TEXT)

    @property
    def texts(self) -> list[str]:
        return self.inputs


def _ids(value: Any, name: str, max_inputs: int) -> list[list[int]]:
    shape = "'ids' must be a list of token ids or a list of such lists"
    if not isinstance(value, list):
        raise ApiError.invalid(shape, "ids")
    # TEI's untagged InputIds: a list of ids first (an empty list too), else a list of lists.
    nested = bool(value) and isinstance(value[0], list)
    seqs = _counted(value, max_inputs, "ids") if nested else [value]
    if nested and not all(isinstance(seq, list) for seq in seqs):
        raise ApiError.invalid(shape, "ids")
    for i, seq in enumerate(seqs):
        where = f"ids[{i}]" if nested else "'ids'"
        if not seq:
            raise ApiError.empty(f"{where} cannot be empty", "ids")
        if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in seq):
            raise ApiError.invalid(f"{where} must hold token ids from 0 to {MAX_TOKEN_ID}", "ids")
    return seqs


@dataclass
class DecodeRequest:
    DESCRIPTION = "TEI's DecodeRequest."

    ids: list[list[int]] = field(
        Shaped(_ids, lambda m: {"oneOf": [TOKEN_IDS, many(TOKEN_IDS, m)]}), required=True
    )
    skip_special_tokens: bool = field(Flag(), default=True)


def parse_embed_request(body: bytes, max_inputs: int) -> EmbedRequest:
    return decode(EmbedRequest, body, max_inputs)


def parse_sparse_request(body: bytes, max_inputs: int) -> SparseRequest:
    """``top_k`` a positive integer (the front door checks it against the vocabulary),
    ``threshold`` a number >= 0; TEI's ``/embed_sparse`` fields as ``/embed`` reads them."""
    return decode(SparseRequest, body, max_inputs)


def parse_tokenize_request(body: bytes, max_inputs: int) -> TokenizeRequest:
    return decode(TokenizeRequest, body, max_inputs)


def parse_decode_request(body: bytes, max_inputs: int) -> DecodeRequest:
    return decode(DecodeRequest, body, max_inputs)


def _texts_list(value: Any, name: str, max_inputs: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ApiError.invalid(f"'{name}' must be a list of strings", name)
    return _counted(value, max_inputs, name)


@dataclass
class RerankRequest:
    """TEI's ``POST /rerank``: ``query`` against each of ``texts``."""

    DESCRIPTION = "TEI's RerankRequest."

    query: str = field(Text(min_length=0), required=True)
    texts: list[str] = field(
        Shaped(_texts_list, lambda m: many({"type": "string"}, m)), required=True
    )
    raw_scores: bool = field(Flag(), default=False)
    return_text: bool = field(Flag(), default=False)
    truncate: bool | None = field(Flag(), description=TRUNCATE_TEXT)
    truncation_direction: str = field(DIRECTION, default="Right")

    def __post_init__(self) -> None:
        if not self.query and not all(self.texts):
            raise ApiError.empty("'query' and a text cannot both be empty", "texts")

    @property
    def direction(self) -> str:
        return self.truncation_direction


PREDICT_SHAPE = "'inputs' must be a string, a pair [text, text] or a list of strings and pairs"


def _is_pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _predict_inputs(value: Any, name: str, max_inputs: int) -> tuple[list, bool]:
    """TEI's untagged ``PredictInput``: one text, one pair ``[a, b]`` (a list of exactly two
    strings is a pair, as serde tries that first), or a list of texts and pairs; with whether
    it was a list (the answer is then a list per input)."""
    if isinstance(value, str):
        inputs: list[str | tuple[str, str]] = [value]
        batched = False
    elif _is_pair(value):
        inputs, batched = [(value[0], value[1])], False
    elif isinstance(value, list):
        items = _counted(value, max_inputs, "inputs")
        if not all(isinstance(v, str) or _is_pair(v) for v in items):
            raise ApiError.invalid(PREDICT_SHAPE, "inputs")
        inputs, batched = [v if isinstance(v, str) else (v[0], v[1]) for v in items], True
    else:
        raise ApiError.invalid(PREDICT_SHAPE, "inputs")
    for i, x in enumerate(inputs):
        if not (x if isinstance(x, str) else x[0] or x[1]):
            where = f"inputs[{i}]" if batched else "'inputs'"
            raise ApiError.empty(f"{where} cannot be empty", "inputs")
    return inputs, batched


def _predict_schema(max_inputs: int) -> Schema:
    pair = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}
    # anyOf: ["a", "b"] is a pair and a list of two texts; TEI takes the pair first.
    return {
        "anyOf": [TEXT, pair, many({"anyOf": [{"type": "string"}, pair]}, max_inputs)],
        "description": "A text, a pair [a, b] (a list of exactly two strings is one pair, as "
        "in TEI), or a list of texts and pairs.",
    }


@dataclass
class PredictRequest:
    """TEI's ``POST /predict``: texts and pairs to classify; ``batched`` when ``inputs`` was a
    list of them (the answer is then a list per input)."""

    DESCRIPTION = "TEI's PredictRequest."

    inputs_given: tuple[list, bool] = field(
        Shaped(_predict_inputs, _predict_schema), required=True, key="inputs"
    )
    raw_scores: bool = field(Flag(), default=False)
    truncate: bool | None = field(Flag(), description=TRUNCATE_TEXT)
    truncation_direction: str = field(DIRECTION, default="Right")

    @property
    def inputs(self) -> list[str | tuple[str, str]]:
        return self.inputs_given[0]

    @property
    def batched(self) -> bool:
        return self.inputs_given[1]

    @property
    def direction(self) -> str:
        return self.truncation_direction


def parse_rerank_request(body: bytes, max_inputs: int) -> RerankRequest:
    return decode(RerankRequest, body, max_inputs)


def parse_predict_request(body: bytes, max_inputs: int) -> PredictRequest:
    return decode(PredictRequest, body, max_inputs)

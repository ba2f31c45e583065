"""Bodies of TEI's routes (``POST /``, ``/embed``, ``/tokenize``, ``/decode``), parsed by hand as
``schema`` parses the OpenAI one: what needs no catalog is checked here, the rest once in the
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

import numpy as np
import orjson

from mesh.ingress.http_errors import ApiError
from mesh.ingress.schema import json_type

# TEI's token ids are u32: larger or negative ids fail its parsing (422).
MAX_TOKEN_ID = 2**32 - 1
# serde accepts the variant's name and these aliases.
DIRECTIONS = {"Right": "right", "right": "right", "Left": "left", "left": "left"}


@dataclass
class TeiInputs:
    """``inputs`` as texts or as token id lists (concatenated, with offsets), never both."""

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


@dataclass
class EmbedRequest:
    inputs: TeiInputs
    normalize: bool = True
    truncate: bool | None = None  # None: the server's --auto-truncate, as TEI
    direction: str = "right"  # "right" | "left"
    dimensions: int | None = None
    prompt_name: str | None = None  # one of the model's prompts; None: its default, if any


@dataclass
class TokenizeRequest:
    texts: list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


@dataclass
class DecodeRequest:
    ids: list[list[int]]
    skip_special_tokens: bool = True


def parse_embed_request(body: bytes, max_inputs: int) -> EmbedRequest:
    return embed_request(json_object(body), max_inputs)


def embed_request(doc: dict[str, object], max_inputs: int) -> EmbedRequest:
    """:func:`parse_embed_request` of a body already parsed (routes that read more of it)."""
    dimensions = doc.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise ApiError.invalid("'dimensions' must be a positive integer", "dimensions")
    request = EmbedRequest(
        inputs=_inputs(doc, max_inputs),
        normalize=_flag(doc, "normalize", True),
        truncate=_optional_flag(doc, "truncate"),
        direction=_direction(doc.get("truncation_direction")),
        dimensions=dimensions,
        prompt_name=_prompt_name(doc),
    )
    if request.prompt_name is not None and request.inputs.texts is None:
        raise ApiError.invalid(
            "'prompt_name' applies to text input only; token ids are embedded as given",
            "prompt_name",
        )
    return request


def parse_tokenize_request(body: bytes, max_inputs: int) -> TokenizeRequest:
    doc = json_object(body)
    value = _required(doc, "inputs")
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        texts = _counted(value, max_inputs, "inputs")
    else:
        raise ApiError.invalid("'inputs' must be a string or a list of strings", "inputs")
    _not_empty_texts(texts)
    return TokenizeRequest(texts, _flag(doc, "add_special_tokens", True), _prompt_name(doc))


def parse_decode_request(body: bytes, max_inputs: int) -> DecodeRequest:
    doc = json_object(body)
    value = _required(doc, "ids")
    if not isinstance(value, list):
        raise ApiError.invalid("'ids' must be a list of token ids or a list of such lists", "ids")
    # TEI's untagged InputIds: a list of ids first (an empty list too), else a list of lists.
    nested = bool(value) and isinstance(value[0], list)
    seqs = _counted(value, max_inputs, "ids") if nested else [value]
    if nested and not all(isinstance(seq, list) for seq in seqs):
        raise ApiError.invalid("'ids' must be a list of token ids or a list of such lists", "ids")
    for i, seq in enumerate(seqs):
        where = f"ids[{i}]" if nested else "'ids'"
        if not seq:
            raise ApiError.empty(f"{where} cannot be empty", "ids")
        if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in seq):
            raise ApiError.invalid(f"{where} must hold token ids from 0 to {MAX_TOKEN_ID}", "ids")
    return DecodeRequest(seqs, _flag(doc, "skip_special_tokens", True))


def json_object(body: bytes) -> dict[str, object]:
    """The body as a JSON object, or ApiError (malformed)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError.malformed(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError.malformed("the body must be a JSON object")
    return doc


def _required(doc: dict[str, object], name: str) -> object:
    if name not in doc:
        raise ApiError.invalid(f"'{name}' is required", name)
    return doc[name]


def _prompt_name(doc: dict[str, object]) -> str | None:
    value = doc.get("prompt_name")
    if value is not None and (not isinstance(value, str) or not value):
        raise ApiError.invalid("'prompt_name' must be a non-empty string", "prompt_name")
    return value


def _flag(doc: dict[str, object], name: str, default: bool) -> bool:
    value = doc.get(name, default)
    if not isinstance(value, bool):
        raise ApiError.invalid(f"'{name}' must be true or false; got {json_type(value)}", name)
    return value


def _optional_flag(doc: dict[str, object], name: str) -> bool | None:
    return None if doc.get(name) is None else _flag(doc, name, False)


def _direction(value: object) -> str:
    if value is None:
        return "right"
    if not isinstance(value, str) or value not in DIRECTIONS:
        raise ApiError.invalid(
            f'\'truncation_direction\' must be "Right" or "Left"; got {value!r}',
            "truncation_direction",
        )
    return DIRECTIONS[value]


def _counted(items: list[object], max_inputs: int, name: str) -> list:
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


def _inputs(doc: dict[str, object], max_inputs: int) -> TeiInputs:
    """TEI's ``Input``: one ``InputType`` (a string or a list of ids) or a list of them."""
    value = _required(doc, "inputs")
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


@dataclass
class RerankRequest:
    """TEI's ``POST /rerank``: ``query`` against each of ``texts``."""

    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None  # None: the server's --auto-truncate, as TEI
    direction: str = "right"


@dataclass
class PredictRequest:
    """TEI's ``POST /predict``: texts and pairs to classify; ``batched`` when ``inputs`` was a
    list of them (the answer is then a list per input)."""

    inputs: list[str | tuple[str, str]]
    batched: bool
    raw_scores: bool = False
    truncate: bool | None = None
    direction: str = "right"


def parse_rerank_request(body: bytes, max_inputs: int) -> RerankRequest:
    doc = json_object(body)
    query = _required(doc, "query")
    if not isinstance(query, str):
        raise ApiError.invalid("'query' must be a string", "query")
    texts = _required(doc, "texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ApiError.invalid("'texts' must be a list of strings", "texts")
    _counted(texts, max_inputs, "texts")
    if not query and not all(texts):
        raise ApiError.empty("'query' and a text cannot both be empty", "texts")
    return RerankRequest(
        query=query,
        texts=texts,
        raw_scores=_flag(doc, "raw_scores", False),
        return_text=_flag(doc, "return_text", False),
        truncate=_optional_flag(doc, "truncate"),
        direction=_direction(doc.get("truncation_direction")),
    )


def parse_predict_request(body: bytes, max_inputs: int) -> PredictRequest:
    """TEI's untagged ``PredictInput``: one text, one pair ``[a, b]`` (a list of exactly two
    strings is a pair, as serde tries that first), or a list of texts and pairs."""
    doc = json_object(body)
    value = _required(doc, "inputs")
    shape = "'inputs' must be a string, a pair [text, text] or a list of strings and pairs"
    batched = True
    if isinstance(value, str):
        inputs: list[str | tuple[str, str]] = [value]
        batched = False
    elif _is_pair(value):
        inputs = [(value[0], value[1])]  # type: ignore[index]
        batched = False
    elif isinstance(value, list):
        items = _counted(value, max_inputs, "inputs")
        if not all(isinstance(v, str) or _is_pair(v) for v in items):
            raise ApiError.invalid(shape, "inputs")
        inputs = [v if isinstance(v, str) else (v[0], v[1]) for v in items]
    else:
        raise ApiError.invalid(shape, "inputs")
    for i, x in enumerate(inputs):
        if not (x if isinstance(x, str) else x[0] or x[1]):
            where = f"inputs[{i}]" if batched else "'inputs'"
            raise ApiError.empty(f"{where} cannot be empty", "inputs")
    return PredictRequest(
        inputs=inputs,
        batched=batched,
        raw_scores=_flag(doc, "raw_scores", False),
        truncate=_optional_flag(doc, "truncate"),
        direction=_direction(doc.get("truncation_direction")),
    )


def _is_pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


@dataclass
class SparseRequest(EmbedRequest):
    """TEI's ``POST /embed_sparse``: ``inputs``, ``truncate``, ``truncation_direction``,
    ``prompt_name`` as ``/embed`` takes them (no ``normalize`` or ``dimensions``), plus ours:
    ``top_k`` (None: the server's default) and ``threshold``."""

    top_k: int | None = None
    threshold: float = 0.0


def parse_sparse_request(body: bytes, max_inputs: int) -> SparseRequest:
    """``top_k`` a positive integer, ``threshold`` a number >= 0 (the front door checks the
    bound of ``top_k``); TEI's ``/embed_sparse`` fields as in :func:`parse_embed_request`."""
    doc = json_object(body)
    top_k = doc.get("top_k")
    if top_k is not None and (type(top_k) is not int or top_k < 1):
        raise ApiError.invalid("'top_k' must be a positive integer", "top_k")
    threshold = doc.get("threshold", 0.0)
    if type(threshold) not in (int, float) or not 0.0 <= threshold < float("inf"):
        raise ApiError.invalid("'threshold' must be a number >= 0", "threshold")
    request = SparseRequest(
        inputs=_inputs(doc, max_inputs),
        normalize=False,
        truncate=_optional_flag(doc, "truncate"),
        direction=_direction(doc.get("truncation_direction")),
        prompt_name=_prompt_name(doc),
        top_k=top_k,
        threshold=float(threshold),
    )
    if request.prompt_name is not None and request.inputs.texts is None:
        raise ApiError.invalid(
            "'prompt_name' applies to text input only; token ids are embedded as given",
            "prompt_name",
        )
    return request

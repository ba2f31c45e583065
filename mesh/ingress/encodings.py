"""Response bodies of ``/v1/embeddings``, written straight from the numpy result.

Vectors never become Python lists: ``float`` rows go to orjson as numpy arrays (it prints each
float32 in its shortest round-tripping form), the base64 formats encode each row's bytes.

``encoding_format`` values, and the worker output kind each asks for:

- ``float`` (OpenAI's default): a JSON array of numbers per input.
- ``base64`` (what the official ``openai`` client asks for, then decodes): the float32 vector,
  little-endian, base64. Decode: ``np.frombuffer(base64.b64decode(s), dtype="<f4")``.
- ``base64_int8`` (Perplexity's format): one signed byte per dimension. Ours are the vector
  scaled by ``127 / max|x|`` and rounded (symmetric per-vector absmax), so values lie in
  -127..127 (a subset of Perplexity's documented -128..127). The scale is not returned: each
  int8 vector is its float vector up to a positive factor, so cosine similarity is preserved,
  raw dot products across vectors are not. Decode: ``np.frombuffer(b, dtype=np.int8)``.
- ``base64_binary`` (Perplexity's format): one bit per dimension, 1 where the component is
  > 0, packed 8 to a byte **LSB first** as Perplexity documents it (dimension 0 is bit 0 of
  byte 0); ``ceil(d / 8)`` bytes, the unused high bits of the last byte zero. Compare with
  Hamming distance. Decode: ``np.unpackbits(b, bitorder="little")[:d]``. Workers pack MSB
  first (``np.packbits``' default); the ingress reverses the bits of each byte with a table.

TEI's routes answer a bare list of float lists (``render_vectors_sliced``).

Big responses are rendered in slices of about ``SLICE_VALUES`` numbers, the event loop free
between them (``render_embeddings_sliced``): orjson holds the GIL for a whole call, so a thread
would not free the loop, while a 2048 × 1024 float response is ~40 ms of orjson in one call.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator

import numpy as np
import orjson

try:  # SIMD base64: 8-14x the standard library's speed, timed on 64 x 384 float32 rows
    import pybase64 as _fast_b64
except ImportError:  # a machine without it still serves, slower
    _fast_b64 = None

# encoding_format → the output kind asked of the worker (proto_msgs.OUTPUT_KINDS).
ENCODINGS: dict[str, str] = {
    "float": "float32",
    "base64": "float32",
    "base64_int8": "int8",
    "base64_binary": "binary",
}

# _BIT_REVERSED[b] is byte b with its bit order reversed: MSB-first packing → LSB-first.
_BIT_REVERSED = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], dtype=np.uint8)


# About 1 ms of rendering per slice (float rows; base64 is faster): a query waiting on the
# loop behind a bulk response waits for one slice, not the whole body.
SLICE_VALUES = 65_536


def render_embeddings(
    embeddings: np.ndarray, encoding_format: str, model: str, prompt_tokens: int
) -> bytes:
    """The OpenAI response body for ``embeddings`` (rows in input order), in one go."""
    return b"".join(_body_parts(embeddings, encoding_format, model, prompt_tokens))


async def render_embeddings_sliced(
    embeddings: np.ndarray, encoding_format: str, model: str, prompt_tokens: int
) -> bytes:
    """The same bytes as ``render_embeddings``, yielding to the event loop between slices."""
    if embeddings.size <= SLICE_VALUES:  # one slice: nothing to interleave with
        return render_embeddings(embeddings, encoding_format, model, prompt_tokens)
    parts = []
    for part in _body_parts(embeddings, encoding_format, model, prompt_tokens):
        parts.append(part)
        await asyncio.sleep(0)
    return b"".join(parts)


async def render_vectors_sliced(embeddings: np.ndarray) -> bytes:
    """TEI's embed body: a bare JSON list of float lists (rows in input order), in slices as
    ``render_embeddings_sliced``."""
    rows = _float_rows(embeddings)
    if rows.size <= SLICE_VALUES:
        return orjson.dumps(rows, option=orjson.OPT_SERIALIZE_NUMPY)
    step = max(1, SLICE_VALUES // max(1, rows.shape[1]))
    parts = [b"["]
    for start in range(0, len(rows), step):
        comma = b"," if start else b""
        parts.append(
            comma
            + orjson.dumps(rows[start : start + step], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        )
        await asyncio.sleep(0)
    parts.append(b"]")
    return b"".join(parts)


def _body_parts(
    embeddings: np.ndarray, encoding_format: str, model: str, prompt_tokens: int
) -> Iterator[bytes]:
    """``{"object":"list","data":[`` slices ``],"model":...,"usage":{...}}``, byte for byte
    what one ``orjson.dumps`` of the whole document writes."""
    to_rows = _ROWS[encoding_format]
    step = max(1, SLICE_VALUES // max(1, embeddings.shape[1]))
    yield b'{"object":"list","data":['
    for start in range(0, len(embeddings), step):
        rows = to_rows(embeddings[start : start + step])
        data = [
            {"object": "embedding", "index": start + i, "embedding": row}
            for i, row in enumerate(rows)
        ]
        comma = b"," if start else b""
        yield comma + orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    yield b'],"model":' + orjson.dumps(model) + b',"usage":' + orjson.dumps(usage) + b"}"


def _float_rows(x: np.ndarray) -> np.ndarray:
    # orjson serializes C-contiguous arrays only; each row of one is a contiguous view.
    return np.ascontiguousarray(x, dtype=np.float32)


def _b64_rows(x: np.ndarray) -> list[str]:
    """Each row's bytes in base64. A bulk response's rows are one encoding's worth of
    ingress CPU on the event loop, so: one call for the whole matrix when a row is a whole
    number of 3-byte groups (then row i's base64 is exactly characters [4/3 i r, 4/3 (i+1) r)
    of the matrix's, no padding inside: 384 or 768 float32 dims), else one call a row."""
    x = np.ascontiguousarray(x)
    row_bytes = x.shape[-1] * x.itemsize if x.ndim else 0
    if x.ndim != 2 or len(x) < 2 or row_bytes % 3 or row_bytes == 0:
        return [_b64(row) for row in x]
    text = _b64(x)
    width = row_bytes // 3 * 4
    return [text[i : i + width] for i in range(0, len(text), width)]


def _b64(data: np.ndarray) -> str:
    if _fast_b64 is not None:
        return _fast_b64.b64encode_as_string(data)
    return base64.b64encode(data).decode("ascii")


def _base64_float(x: np.ndarray) -> list[str]:
    return _b64_rows(x.astype("<f4", copy=False))


def _base64_int8(x: np.ndarray) -> list[str]:
    return _b64_rows(x.astype(np.int8, copy=False))


def _base64_binary(x: np.ndarray) -> list[str]:
    return _b64_rows(_BIT_REVERSED[x.astype(np.uint8, copy=False)])


_ROWS: dict[str, Callable[[np.ndarray], np.ndarray | list[str]]] = {
    "float": _float_rows,
    "base64": _base64_float,
    "base64_int8": _base64_int8,
    "base64_binary": _base64_binary,
}


def render_rows(x: np.ndarray, encoding_format: str) -> np.ndarray | list[str]:
    """Rows of ``x`` in ``encoding_format``, each ready for orjson (with OPT_SERIALIZE_NUMPY):
    for the routes that nest vectors in their own shapes (contextualized chunks, per token)."""
    return _ROWS[encoding_format](x)

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
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import orjson

# encoding_format → the output kind asked of the worker (proto_msgs.OUTPUT_KINDS).
ENCODINGS: dict[str, str] = {
    "float": "float32",
    "base64": "float32",
    "base64_int8": "int8",
    "base64_binary": "binary",
}

# _BIT_REVERSED[b] is byte b with its bit order reversed: MSB-first packing → LSB-first.
_BIT_REVERSED = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], dtype=np.uint8)


def render_embeddings(
    embeddings: np.ndarray, encoding_format: str, model: str, prompt_tokens: int
) -> bytes:
    """The OpenAI response body for ``embeddings`` (rows in input order)."""
    rows = _ROWS[encoding_format](embeddings)
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)
            ],
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def _float_rows(x: np.ndarray) -> np.ndarray:
    # orjson serializes C-contiguous arrays only; each row of one is a contiguous view.
    return np.ascontiguousarray(x, dtype=np.float32)


def _b64_rows(x: np.ndarray) -> list[str]:
    return [base64.b64encode(row).decode("ascii") for row in np.ascontiguousarray(x)]


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

"""mesh-embed's HTTP client, its pure parts: Retry-After, backoff, decoding, error messages."""

from __future__ import annotations

import base64
import email.utils

import numpy as np
import pytest

from mesh.embed_cli.client import BACKOFF_S, backoff_s, decode, error_message, retry_after_s
from mesh.embed_cli.errors import ServerRefused


@pytest.mark.parametrize(
    ("headers", "wait"),
    [({"Retry-After": "2"}, 2.0), ({"retry-after": "0.5"}, 0.5), ({"retry-after-ms": "250"}, 0.25),
     ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25), ({"Retry-After": "-3"}, 0.0),
     ({}, None), ({"Retry-After": "soon"}, None)],
)  # fmt: skip
def test_retry_after_in_seconds_or_milliseconds(headers: dict, wait: float | None) -> None:
    lowered = {k.lower(): v for k, v in headers.items()}  # aiohttp's headers are case-blind
    assert retry_after_s(lowered) == wait


def test_retry_after_as_an_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_s({"retry-after": email.utils.formatdate(now + 30, usegmt=True)}, now) == 30


def test_backoff_doubles_up_to_its_cap() -> None:
    first, longest = BACKOFF_S
    assert first * 0.75 <= backoff_s(0) <= first
    assert backoff_s(1) > first
    assert longest * 0.75 <= backoff_s(30) <= longest


def test_base64_and_float_vectors_decode_by_their_index() -> None:
    rows = np.arange(6, dtype=np.float32).reshape(2, 3) / 3
    b64 = [{"index": 1, "embedding": base64.b64encode(rows[1].tobytes()).decode()},
           {"index": 0, "embedding": base64.b64encode(rows[0].tobytes()).decode()}]  # fmt: skip
    assert np.array_equal(decode({"data": b64}, 2, None), rows)
    floats = [
        {"index": 0, "embedding": rows[0].tolist()},
        {"index": 1, "embedding": rows[1].tolist()},
    ]
    assert np.array_equal(decode({"data": floats}, 2, 3), rows)


def test_a_short_or_ragged_answer_is_refused() -> None:
    with pytest.raises(ServerRefused, match="answered 1 embeddings for 2 inputs"):
        decode({"data": [{"index": 0, "embedding": [1.0]}]}, 2, None)
    ragged = {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]}
    with pytest.raises(ServerRefused, match="widths"):
        decode(ragged, 2, None)
    with pytest.raises(ServerRefused, match="widths"):
        decode({"data": [{"index": 0, "embedding": [1.0, 2.0]}]}, 1, 3)


@pytest.mark.parametrize("indices", [[0, 2], [0, -1], [1, 1]])
def test_an_index_out_of_range_or_repeated_is_refused(indices: list[int]) -> None:
    data = [{"index": i, "embedding": [1.0, 2.0]} for i in indices]
    with pytest.raises(ServerRefused, match=f"index {indices[-1]} twice or outside 0..1"):
        decode({"data": data}, 2, None)


def test_error_messages_are_the_servers_own() -> None:
    assert error_message(422, b'{"error": {"message": "too long", "type": "x"}}') == (
        "HTTP 422: too long"
    )
    assert error_message(413, b'{"error": "TEI says no", "error_type": "Validation"}') == (
        "HTTP 413: TEI says no"
    )
    assert error_message(400, b"<html>bad</html>") == "HTTP 400: <html>bad</html>"


def test_invalid_base64_is_an_error_not_a_vector() -> None:
    with pytest.raises(ValueError):
        decode({"data": [{"index": 0, "embedding": "not base64!"}]}, 1, None)

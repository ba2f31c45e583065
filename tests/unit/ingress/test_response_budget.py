"""The response-bytes bound: the estimate is an upper bound of the real bodies, one response
over the bound is 413 saying how many inputs fit, the process budget answers 429 while full
and frees as handlers end."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from mesh.client import ValidRequest
from mesh.ingress.encodings import ENCODINGS, render_embeddings, render_rows
from mesh.ingress.http_errors import ApiError
from mesh.ingress.responses import ResponseBudget, answer_width, row_bytes
from proto_msgs import Lane, ModelInfo, OutputOptions

MODEL = ModelInfo(
    name="m", aliases=[], dims=384, max_input_tokens=256, vocab_size=30522, pooling="mean",
    normalize=True, tokenizer_digest="0" * 64, hidden_size=768,
)  # fmt: skip


def valid(n: int, output: OutputOptions | None = None) -> ValidRequest:
    lengths = np.full(n, 8, dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = np.full(int(offsets[-1]), 5, dtype=np.int32)
    return ValidRequest(MODEL, ids, offsets, lengths, output or OutputOptions(), Lane.BATCH)


@pytest.mark.parametrize("fmt", list(ENCODINGS))
def test_the_estimate_bounds_the_rendered_openai_body(fmt: str) -> None:
    rng = np.random.default_rng(0)
    n, dims = 64, 384
    # Values of every magnitude: orjson's longest forms are tiny and negative ones.
    x = (rng.standard_normal((n, dims)) * 10.0 ** rng.integers(-9, 3, (n, dims))).astype("f4")
    kind = ENCODINGS[fmt]
    if kind == "int8":
        x = np.clip(x * 127, -127, 127).astype(np.int8)
    elif kind == "binary":
        x = np.packbits(x > 0, axis=1)
    body = render_embeddings(x, fmt, "m", 1000)
    assert len(body) <= n * row_bytes(dims, kind, fmt)


def test_the_estimate_bounds_a_per_token_body_of_raw_states() -> None:
    rng = np.random.default_rng(1)
    states = (rng.standard_normal((300, 768)) * 3).astype("f4")
    body = orjson.dumps(render_rows(states, "float"), option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(body) <= 300 * row_bytes(768, "float32", "float")
    tokens = OutputOptions(dims=None, normalize=False, kind="float32", rows="spans")
    assert answer_width(valid(1, tokens)) == 768  # hidden states, not the pooled width
    assert answer_width(valid(1, OutputOptions(dims=128))) == 128
    assert answer_width(valid(1)) == 384


async def test_one_response_over_the_bound_is_413_saying_the_bound_and_what_fits() -> None:
    row = row_bytes(384, "float32", "float")
    budget = ResponseBudget(process_bytes=100 * row, response_bytes=10 * row)
    with pytest.raises(ApiError) as exc:
        budget.reserve(valid(40), "float")
    err = exc.value
    assert err.status == 413 and err.code == "request_too_large"
    assert f"{10 * row} bytes per response" in err.message
    assert "about 10 of these 40 inputs fit" in err.message and "base64" in err.message
    assert budget.held == 0
    assert budget.reserve(valid(10), "float") == 10 * row


async def test_the_process_budget_refuses_with_429_while_full_and_frees_as_handlers_end() -> None:
    row = row_bytes(384, "float32", "float")
    budget = ResponseBudget(process_bytes=25 * row, response_bytes=10 * row)
    release = asyncio.Event()

    async def handler(n: int, sending: asyncio.Event = release) -> int:
        size = budget.reserve(valid(n), "float")
        await sending.wait()  # building and sending its response
        return size

    done = asyncio.Event()
    done.set()

    held = [asyncio.create_task(handler(10)) for _ in range(2)]
    await asyncio.sleep(0)
    assert budget.held == 20 * row
    with pytest.raises(ApiError) as exc:
        await handler(10)
    assert exc.value.status == 429 and exc.value.code == "overloaded"
    assert exc.value.retry_after_s == 1.0
    assert await asyncio.wait_for(handler(5, done), 1) == 5 * row  # what fits is served
    release.set()
    await asyncio.gather(*held)
    assert budget.held == 0
    late = asyncio.create_task(handler(10, asyncio.Event()))
    await asyncio.sleep(0)
    late.cancel()  # a client that hangs up frees its reservation too
    with pytest.raises(asyncio.CancelledError):
        await late
    assert budget.held == 0


def test_a_per_response_bound_over_the_process_budget_is_lowered_to_it() -> None:
    assert ResponseBudget(process_bytes=1000, response_bytes=5000).response_bytes == 1000

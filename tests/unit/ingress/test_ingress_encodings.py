"""Response bodies: float JSON, base64 float32, base64_int8, base64_binary (LSB first)."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import orjson
import pytest

from mesh.ingress.encodings import SLICE_VALUES, render_embeddings, render_embeddings_sliced


def rendered(x: np.ndarray, fmt: str, tokens: int = 7) -> dict:
    return orjson.loads(render_embeddings(x, fmt, "m", tokens))


@pytest.fixture
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 384)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_body_has_the_openai_shape(vectors: np.ndarray) -> None:
    doc = rendered(vectors, "float", tokens=42)
    assert doc["object"] == "list" and doc["model"] == "m"
    assert doc["usage"] == {"prompt_tokens": 42, "total_tokens": 42}
    assert [d["index"] for d in doc["data"]] == [0, 1, 2, 3, 4]
    assert all(d["object"] == "embedding" for d in doc["data"])


def test_float_json_round_trips_every_float32_exactly(vectors: np.ndarray) -> None:
    doc = rendered(vectors, "float")
    back = np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)
    assert np.array_equal(back, vectors)


def test_base64_is_little_endian_float32_as_the_openai_client_decodes_it(
    vectors: np.ndarray,
) -> None:
    doc = rendered(vectors.astype(">f4"), "base64")  # even a big-endian array goes out LE
    for i, d in enumerate(doc["data"]):
        back = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        assert np.array_equal(back, vectors[i])


def test_base64_int8_is_one_signed_byte_per_dimension() -> None:
    q = np.array([[-127, -1, 0, 1, 127], [5, -5, 0, 0, 0]], dtype=np.int8)
    doc = rendered(q, "base64_int8")
    for i, d in enumerate(doc["data"]):
        back = np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.int8)
        assert np.array_equal(back, q[i])


@pytest.mark.parametrize("dims", [384, 13, 8, 1])
def test_base64_binary_packs_sign_bits_lsb_first(vectors: np.ndarray, dims: int) -> None:
    x = vectors[:, :dims]
    worker_bits = np.packbits(x > 0, axis=1)  # what workers send: MSB first
    doc = rendered(worker_bits, "base64_binary")
    for i, d in enumerate(doc["data"]):
        raw = np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.uint8)
        assert len(raw) == (dims + 7) // 8
        assert np.array_equal(np.unpackbits(raw, bitorder="little")[:dims], x[i] > 0)
        assert np.array_equal(raw, np.packbits(x[i] > 0, bitorder="little"))
        assert not np.unpackbits(raw, bitorder="little")[dims:].any()  # padding bits are 0


def test_base64_binary_puts_dimension_zero_in_bit_zero() -> None:
    worker_bits = np.packbits(np.array([[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]], dtype=bool), axis=1)
    raw = base64.b64decode(rendered(worker_bits, "base64_binary")["data"][0]["embedding"])
    assert raw == bytes([0b0000_0001, 0b0000_0010])


def test_an_empty_result_renders_an_empty_list() -> None:
    assert rendered(np.zeros((0, 4), dtype=np.float32), "float")["data"] == []


@pytest.mark.parametrize("fmt", ["float", "base64", "base64_int8", "base64_binary"])
async def test_big_responses_render_in_slices_to_the_same_bytes(fmt: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2048, 384)).astype(np.float32)  # 12 slices of SLICE_VALUES
    if fmt == "base64_int8":
        x = (x * 40).clip(-127, 127).astype(np.int8)
    elif fmt == "base64_binary":
        x = np.packbits(x > 0, axis=1)
    want = render_embeddings(x, fmt, "m", 99)
    assert orjson.loads(want)["data"][2047]["index"] == 2047
    yields = 0

    async def count_yields() -> None:
        nonlocal yields
        while True:
            await asyncio.sleep(0)
            yields += 1

    counter = asyncio.ensure_future(count_yields())
    got = await render_embeddings_sliced(x, fmt, "m", 99)
    counter.cancel()
    assert got == want
    assert yields >= x.size // SLICE_VALUES  # the loop ran between slices


@pytest.mark.parametrize("fast", [True, False], ids=["pybase64", "stdlib"])
@pytest.mark.parametrize(
    ("rows", "dims", "dtype"),
    [
        (64, 384, "<f4"),  # whole 3-byte groups a row: one encoding of the matrix, sliced
        (7, 768, "<f4"),
        (1, 384, "<f4"),
        (3, 1024, "<f4"),  # 4096 bytes a row, not a multiple of 3: one call a row
        (5, 7, "<f4"),
        (4, 48, "i1"),
        (4, 5, "u1"),
        (0, 384, "<f4"),
    ],
)
def test_base64_rows_are_each_rows_own_encoding(
    monkeypatch: pytest.MonkeyPatch, fast: bool, rows: int, dims: int, dtype: str
) -> None:
    from mesh.ingress import encodings

    if not fast:  # the fallback a host without pybase64 takes
        monkeypatch.setattr(encodings, "_fast_b64", None)
    elif encodings._fast_b64 is None:
        pytest.fail("pybase64 is a dependency: it should be installed")
    rng = np.random.default_rng(rows * dims)
    if np.dtype(dtype).kind == "f":
        x = (rng.standard_normal((rows, dims)) * 50).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=(rows, dims), endpoint=True, dtype=dtype)
    want = [base64.b64encode(row.tobytes()).decode("ascii") for row in x]
    assert encodings._b64_rows(x) == want
    # A strided view (rows of a wider matrix) gives the same as its copy.
    wide = np.zeros((rows, dims * 2), dtype=dtype)
    wide[:, ::2] = x
    assert encodings._b64_rows(wide[:, ::2]) == want

"""Realistic instances of every wire message and a field-by-field comparison, shared by the
proto_msgs contract tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import dataclasses
import math
from enum import IntEnum
from typing import Any

import numpy as np

from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    BrokerStats,
    CancelRequest,
    CatalogReply,
    CatalogRequest,
    Disconnect,
    ErrorCode,
    Heartbeat,
    Lane,
    Message,
    ModelInfo,
    OutputOptions,
    Ping,
    Pong,
    RequestError,
    RequestResult,
    SubmitRequest,
    TokenizerReply,
    TokenizerRequest,
    WorkerReady,
)
from proto_msgs.stats import WAIT_BUCKETS_S, LaneStats, ModelStats, WorkerStats

# Three tokenized sentences, as a BERT WordPiece tokenizer gives them ([CLS] ... [SEP]).
SENTENCES = [[101, 7592, 2088, 102], [101, 2023, 2003, 1037, 3231, 102], [101, 102]]


def ragged(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``token_ids`` and ``offsets`` of ``seqs``, as the wire carries them."""
    token_ids = np.array([t for s in seqs for t in s], dtype=np.int32)
    offsets = np.cumsum([0, *map(len, seqs)], dtype=np.int32)
    return token_ids, offsets


def submit(seqs: list[list[int]] = SENTENCES, **changes: Any) -> SubmitRequest:
    """A valid SubmitRequest of ``seqs`` for the tests to spoil one field of."""
    token_ids, offsets = ragged(seqs)
    fields = dict(
        cid=77,
        model="all-MiniLM-L6-v2",
        lane=Lane.INTERACTIVE,
        timeout_ms=1000,
        output=OutputOptions(),
        token_ids=token_ids,
        offsets=offsets,
    )
    return SubmitRequest(**{**fields, **changes})


def minilm() -> ModelInfo:
    return ModelInfo(
        name="all-MiniLM-L6-v2",
        aliases=["sentence-transformers/all-MiniLM-L6-v2", "minilm"],
        dims=384,
        max_input_tokens=256,
        vocab_size=30522,
        pooling="mean",
        normalize=True,
        tokenizer_digest="9f" * 32,
    )


def embeddings(rows: int, kind: str, dims: int = 384) -> np.ndarray:
    """``rows`` vectors of one output kind, with the dtype and width it travels with."""
    rng = np.random.default_rng(rows * 31 + dims)
    vectors = rng.standard_normal((rows, dims)).astype(np.float32)
    if kind == "float32":
        return vectors
    if kind == "float16":
        return vectors.astype(np.float16)
    if kind == "int8":
        return np.clip(np.round(vectors * 40), -127, 127).astype(np.int8)
    return np.packbits(vectors > 0, axis=1)  # binary: uint8 [rows, dims / 8]


def _submits() -> list[Message]:
    token_ids, offsets = ragged(SENTENCES)
    one_ids, one_offsets = ragged([SENTENCES[0]])
    return [
        SubmitRequest(
            cid=1,
            model="all-MiniLM-L6-v2",
            lane=Lane.INTERACTIVE,
            timeout_ms=30_000,
            output=OutputOptions(dims=256, normalize=True, kind="int8"),
            token_ids=token_ids,
            offsets=offsets,
        ),
        SubmitRequest(
            cid=2**63 - 1,
            model="minilm",
            lane=Lane.BATCH,
            timeout_ms=None,
            output=OutputOptions(),
            token_ids=one_ids,
            offsets=one_offsets,
        ),
        # A cross-encoder's request: pairs split where their second text begins, a single 0.
        SubmitRequest(
            cid=3,
            model="ms-marco-MiniLM-L6-v2",
            lane=Lane.INTERACTIVE,
            timeout_ms=10_000,
            output=OutputOptions(normalize=False),
            token_ids=token_ids,
            offsets=offsets,
            segment_b_start=np.array([2, 3, 0], dtype=np.int32),
        ),
        # Contextualized chunks: one span per chunk of each document, relative to it.
        SubmitRequest(
            cid=4,
            model="all-MiniLM-L6-v2",
            lane=Lane.BATCH,
            timeout_ms=None,
            output=OutputOptions(kind="int8", rows="spans"),
            token_ids=token_ids,
            offsets=offsets,
            spans=np.array([[1, 2], [2, 4], [1, 3], [0, 2]], dtype=np.int32),
            span_offsets=np.array([0, 2, 3, 4], dtype=np.int32),
        ),
    ]


def _results() -> list[Message]:
    out: list[Message] = [
        RequestResult(
            cid=3,
            prompt_tokens=10,
            indices=np.array([2, 0], dtype=np.int32),
            embeddings=embeddings(2, kind),
        )
        for kind in ("float32", "float16", "int8", "binary")
    ]
    empty = RequestResult(
        cid=3,
        prompt_tokens=0,
        indices=np.zeros(0, np.int32),
        embeddings=np.zeros((0, 384), np.float32),
    )
    spans = RequestResult(
        cid=4,
        prompt_tokens=12,
        indices=np.array([1, 0], dtype=np.int32),
        embeddings=embeddings(3, "int8"),
        row_offsets=np.array([0, 1, 3], dtype=np.int32),
    )
    return [*out, empty, spans]


def _worker_side() -> list[Message]:
    token_ids, offsets = ragged(SENTENCES)
    return [
        WorkerReady(
            name="gpu-host-3:cuda:0",
            model=minilm(),
            tokenizer_json=b'{"version": "1.0", "model": {"type": "WordPiece"}}',
            max_batch_tokens=16384,
            max_batch_requests=512,
            credits=2,
            heartbeat_ms=1000,
            device="cuda:0",
        ),
        BatchAssign(
            batch_id=41,
            model="all-MiniLM-L6-v2",
            timeout_ms=60_000,
            outputs=[OutputOptions(), OutputOptions(dims=128, normalize=False, kind="binary")],
            output_index=np.array([0, 1, 0], dtype=np.int32),
            token_ids=token_ids,
            offsets=offsets,
        ),
        BatchResult(
            batch_id=41,
            compute_ms=3.25,
            embeddings=[embeddings(2, "float32"), embeddings(1, "binary", dims=128)],
        ),
        BatchResult(batch_id=42, compute_ms=0.0, embeddings=[]),
        BatchError(batch_id=43, code=ErrorCode.INTERNAL, message="CUDA OOM", retryable=True),
        Heartbeat(progress=1234, busy=True),
        Heartbeat(progress=0, busy=False),
        Disconnect(reason="worker shutting down"),
    ]


def sample_messages() -> list[Message]:
    """At least one realistic instance of every registered message class."""
    stats = BrokerStats(
        queued_tokens={"all-MiniLM-L6-v2": 5120},
        queued_sequences={"all-MiniLM-L6-v2": 40},
        workers={"all-MiniLM-L6-v2": 2},
        inflight_batches=3,
        dropped_frames=1,
        models={
            "all-MiniLM-L6-v2": ModelStats(
                lanes=[
                    LaneStats(1, 8, 100, 800, [3] + [0] * len(WAIT_BUCKETS_S), 0.002),
                    LaneStats(39, 5112, 4000, 512000, [0] * 16 + [2], 250.5),
                ],
                batches=40, batch_tokens=512800, batch_budget_tokens=655360, queued_s=0.25,
            )
        },
        worker_list=[
            WorkerStats("0080000001", "gpu-host:cuda:0", "all-MiniLM-L6-v2", "cuda:0", "busy",
                        inflight_batches=2, credits=3, tokens_per_s=6.5e6, batches_done=40,
                        tokens_done=512800, since_s=0.1),
            WorkerStats("0080000002", "gpu-host:cuda:1", "all-MiniLM-L6-v2", "cuda:1", "down",
                        since_s=4.0, reason="silent for 3.1s"),
        ],
    )  # fmt: skip
    return [
        *_submits(),
        CancelRequest(cid=1),
        *_results(),
        RequestError(cid=4, code=ErrorCode.OVERLOADED, message="queue full", retry_after_ms=250),
        RequestError(cid=5, code=ErrorCode.MODEL_NOT_FOUND, message="no model 'x'"),
        CatalogRequest(cid=6),
        CatalogReply(cid=6, models=[minilm()]),
        CatalogReply(cid=7, models=[]),
        TokenizerRequest(cid=8, digest="9f" * 32),
        TokenizerReply(cid=8, digest="9f" * 32, found=True, content=b'{"version": "1.0"}'),
        TokenizerReply(cid=9, digest="00" * 32, found=False, content=b""),
        Ping(cid=10),
        Pong(cid=10, stats=stats, instance=0x5EED_CAFE_F00D),
        Pong(cid=11, stats=BrokerStats()),
        *_worker_side(),
    ]


def assert_same_message(got: Any, want: Any, where: str = "") -> None:
    """Field-by-field equality; arrays must match in values, shape and dtype."""
    where = where or type(want).__name__
    # Enum members (ErrorCode) travel as plain ints and come back as such.
    want_type = int if isinstance(want, IntEnum) else type(want)
    assert type(got) is want_type, f"{where}: {type(got).__name__} != {want_type.__name__}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
        # Bit-exact, as the wire is raw bytes (NaN payloads and -0.0 included).
        assert got.tobytes() == want.tobytes(), f"{where}: values differ"
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            assert_same_message(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_message(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), f"{where}: {got!r} != nan"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"

"""The worker's live lane on CUDA (mesh.worker.live_lane): its sibling engine replays graphs
of its own on a high-priority stream, and a query run there while bulk batches run on the
main engine's stream gets the vectors it gets alone."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.shapes import bert_base_dir
from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.engine import Engine
from mesh.worker.live_lane import LiveLane
from mesh.worker.server import INLINE_MAX_TOKENS

MINILM_DIR = default_model_path()  # the embedded all-MiniLM-L6-v2
# Every graph bucket up to the lane's 1,024 tokens: all captured at start.
LANE_BUCKETS = [16, 32, 64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1024]


def _packed(seed: int, n: int, most: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    lengths = gen.integers(4, most, size=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return gen.integers(1000, 30000, size=int(offsets[-1])).astype(np.int32), offsets


@pytest.fixture(scope="module", params=["minilm", "bert-base"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM (head_dim 32: torch's varlen attention) and a BERT-base shape (head_dim 64:
    FlashInfer, with GEMMs large enough for cuBLAS kernels that use its workspace). The lane
    once deadlocked the H200 beside bulk with the second and never with the first."""
    if request.param == "minilm":
        return MINILM_DIR
    return bert_base_dir(tmp_path_factory.mktemp("bert-base-lane"))


def test_queries_on_the_live_lane_beside_bulk_match_the_engine_alone(model_dir: Path) -> None:
    engine = Engine.load(model_dir, device="cuda")
    engine.warmup([8192, 16384])
    lane = LiveLane(engine, INLINE_MAX_TOKENS)
    assert lane.warmup() > 0
    assert lane.engine.runner is not engine.runner and lane.engine.model is engine.model
    assert sorted(lane.engine.runner.graphs) == LANE_BUCKETS
    # Graphs keep the cuBLAS workspace of the stream they were captured on: the lane's and
    # the bulk's must differ, or the two streams' GEMMs share one workspace at once.
    streams = (lane.engine.runner.capture_stream, engine.runner.capture_stream)
    assert None not in streams and streams[0] != streams[1]
    queries = [_packed(seed, n=1 + seed % 4, most=40) for seed in range(48)]
    want = [engine.embed(ids, offsets).float().cpu() for ids, offsets in queries]
    bulk = [_packed(100 + i, n=120, most=250) for i in range(12)]  # ~15k tokens each

    stop = threading.Event()
    ran: list[int] = []
    got: list[torch.Tensor] = []

    def run_bulk() -> None:  # the worker's compute thread: bulk on the main stream
        with torch.inference_mode():
            while not stop.is_set():
                for ids, offsets in bulk:
                    ran.append(engine.embed(ids, offsets).shape[0])
            torch.cuda.synchronize()

    def run_queries() -> None:  # the worker's link thread: queries on the lane's stream
        with torch.inference_mode(), lane.running():
            for ids, offsets in queries:
                pooled = lane.engine.embed(ids, offsets)
                lane.stream.synchronize()
                got.append(pooled.float().cpu())

    replayed = lane.engine.runner.graph_batches
    bulk_thread = threading.Thread(target=run_bulk, daemon=True)
    query_thread = threading.Thread(target=run_queries, daemon=True)
    bulk_thread.start()
    query_thread.start()
    # A deadlock on the device leaves both threads in a synchronize for good: fail, not hang.
    query_thread.join(120)
    stop.set()
    bulk_thread.join(120)
    assert not query_thread.is_alive(), f"the lane stalled after {len(got)} queries"
    assert not bulk_thread.is_alive() and ran, "bulk ran beside the queries, and finished"
    assert lane.engine.runner.graph_batches - replayed == len(queries)  # all through its graphs
    for g, w in zip(got, want, strict=True):
        cos = torch.nn.functional.cosine_similarity(g, w, dim=1)
        assert cos.min().item() > 0.9999


def test_lazy_captures_draw_no_stream_that_could_be_the_lanes(monkeypatch) -> None:
    """torch hands streams out of a pool of 32 in turn. Captures run their warm pass on their
    runner's capture stream, so a worker capturing bucket after bucket for hours never comes
    round to the lane's capture stream (whose cuBLAS workspace the lane's graphs hold)."""
    engine = Engine.load(MINILM_DIR, device="cuda")
    lane = LiveLane(engine, INLINE_MAX_TOKENS)
    lane.warmup()
    drawn = []
    real = torch.cuda.Stream

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        stream = real(*args, **kwargs)
        # torch.cuda.current_stream() wraps an existing stream through Stream(stream_id=...);
        # only a call without one draws from the pool.
        if "stream_id" not in kwargs:
            drawn.append(stream)
        return stream

    monkeypatch.setattr(torch.cuda, "Stream", counting)
    engine.warmup([16, 32, 64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536])
    assert len(engine.runner.graphs) >= 15
    assert drawn == []  # every warm pass ran on the runner's own capture stream
    assert lane.engine.runner.capture_stream != engine.runner.capture_stream

"""The batch budget a worker advertises by default: on CUDA never more than the largest graph
bucket (a batch over it runs eagerly), following the buckets when they are capped lower."""

from __future__ import annotations

import pytest

from mesh.worker.engine.engine import (
    DEFAULT_MAX_BATCH_TOKENS,
    GRAPH_MAX_TOKENS,
    default_max_batch_tokens,
)
from mesh.worker.engine.gpu import bucket_sizes


def test_the_gpu_default_is_the_largest_graph_bucket() -> None:
    largest = bucket_sizes(GRAPH_MAX_TOKENS)[-1]
    assert DEFAULT_MAX_BATCH_TOKENS["cuda"] <= largest
    assert default_max_batch_tokens("cuda") == largest


@pytest.mark.parametrize("graph_max_tokens", [256, 1000, 8192, 12288, 20000, 65536])
def test_the_gpu_default_never_exceeds_the_buckets_in_use(graph_max_tokens: int) -> None:
    budget = default_max_batch_tokens("cuda", graph_max_tokens)
    assert budget <= bucket_sizes(graph_max_tokens)[-1]
    assert budget <= DEFAULT_MAX_BATCH_TOKENS["cuda"]
    assert budget in bucket_sizes(graph_max_tokens)  # a full batch fits a graph exactly


def test_the_cpu_default_has_no_graph_cap() -> None:
    assert default_max_batch_tokens("cpu", 256) == DEFAULT_MAX_BATCH_TOKENS["cpu"]

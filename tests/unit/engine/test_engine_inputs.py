"""Engine edge cases: an empty batch, the final vectors' options. A malformed batch (offsets,
empty sequences, ids outside the vocabulary, a sequence over the limit, non-integer arrays)
never reaches the engine: the wire codec refuses it (tests/unit/proto/test_wire_rejects.py)
and the broker checks every submit against the model card
(tests/unit/broker/test_broker_bad_requests.py); the worker trusts its broker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mesh.worker.engine.engine import Engine


@pytest.fixture(scope="module")
def engine(minilm_dir: Path) -> Engine:
    return Engine.load(minilm_dir)


def _i32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def test_an_empty_batch_gives_an_empty_result(engine: Engine) -> None:
    out = engine.embed(_i32(), _i32(0))
    assert tuple(out.shape) == (0, 384)
    assert engine.embed_final(_i32(), _i32(0), kind="binary").shape == (0, 48)


def test_the_final_vectors_follow_the_card_and_the_request(engine: Engine) -> None:
    ids, offsets = _i32(101, 7592, 2088, 102, 101, 102), _i32(0, 4, 6)
    default = engine.embed_final(ids, offsets)
    assert default.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(default, axis=1), 1.0, rtol=1e-6)
    raw = engine.embed_final(ids, offsets, normalize=False)
    np.testing.assert_allclose(raw, engine.embed(ids, offsets).numpy())
    assert engine.embed_final(ids, offsets, dims=64, kind="int8").shape == (2, 64)
    with pytest.raises(ValueError, match="dims"):
        engine.embed_final(ids, offsets, dims=385)


def test_the_advertised_token_budget_defaults_for_cpu(engine: Engine) -> None:
    assert engine.max_batch_tokens == 8192

"""bench/null_worker.py: the null engine answers at once with deterministic rows of its model's
dimensions, and the real worker serves it (one reply per batch, the rows it made)."""

from __future__ import annotations

import numpy as np
import torch

from bench.null_worker import NullEngine
from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.runner import EngineBatch
from proto_msgs import BatchResult, encode
from tests.unit.worker.worker_fakes import assign, next_reply, serving


def _engine() -> NullEngine:
    return NullEngine.from_model(default_model_path(), max_batch_tokens=1024)


def test_the_null_engine_has_the_models_card_and_no_weights() -> None:
    engine = _engine()
    assert engine.card.name == "all-MiniLM-L6-v2" and engine.card.dims == 384
    assert engine.card.tokenizer_json  # the ingress tokenizes with it as for the real engine
    assert engine.vocab_size == 30522 and engine.hidden_size == 384
    assert engine.max_batch_tokens == 1024 and not engine.has_lexical


def test_rows_are_a_function_of_each_sequence_alone() -> None:
    engine = _engine()
    ids = np.array([101, 7, 102, 5, 9, 9, 9], dtype=np.int32)
    out = engine.run(EngineBatch(ids, np.array([0, 3, 7])))
    assert out.pooled.shape == (2, 384) and out.pooled.dtype == torch.float32
    assert out.pooled[:, :2].tolist() == [[3.0, 102.0], [4.0, 6.0]]
    assert bool((out.pooled[:, 2:] == 1).all())
    again = engine.run(EngineBatch(ids[3:], np.array([0, 4])))
    assert torch.equal(again.pooled[0], out.pooled[1])  # batch-mates change nothing
    assert engine.batches == 2


def test_spans_get_rows_of_the_hidden_width() -> None:
    out = _engine().run(EngineBatch(np.arange(1, 5), np.array([0, 4]), spans=np.array([[0, 2]])))
    assert out.span_rows is not None and out.span_rows.shape == (1, 384)


def test_the_real_worker_serves_the_null_engine() -> None:
    engine = _engine()
    with serving(engine, "inproc://null-worker") as (router, identity, _server):
        router.send_multipart([identity, *encode(assign(1, tokens=6))])
        reply = next_reply(router)
    assert isinstance(reply, BatchResult) and reply.batch_id == 1
    rows = np.asarray(reply.embeddings[0])
    assert rows.shape == (2, 384) and rows[:, 0].tolist() == [2.0, 4.0]
    assert engine.batches == 1


def test_a_wrong_flag_is_refused_as_mesh_launch_refuses_it(capsys) -> None:  # noqa: ANN001
    from bench.null_worker import main

    assert main(["--no-such-flag"]) == 2
    assert "No such option '--no-such-flag'" in capsys.readouterr().err

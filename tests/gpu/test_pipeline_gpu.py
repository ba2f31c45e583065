"""The worker's two-deep pipeline on CUDA: batches launched back to back (the second before
the first is collected) come back with their own results, equal to the synchronous path,
through graphs and pinned result slots reused across batches, stamped for the reply's
timings."""

from __future__ import annotations

import numpy as np
import torch

from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.outputs import finalize
from mesh.worker.engine.runner import EngineBatch, EngineOutputs
from mesh.worker.pipeline import ResultPipeline
from proto_msgs import BatchAssign, OutputOptions

MINILM_DIR = default_model_path()  # the embedded all-MiniLM-L6-v2


def _batch(batch_id: int, seed: int, n: int, outputs: list[OutputOptions]) -> BatchAssign:
    gen = np.random.default_rng(seed)
    lengths = gen.integers(1, 300, size=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return BatchAssign(
        batch_id=batch_id,
        model="m",
        timeout_ms=60_000,
        outputs=outputs,
        output_index=gen.integers(0, len(outputs), size=n).astype(np.int32),
        token_ids=gen.integers(1000, 30000, size=int(offsets[-1])).astype(np.int32),
        offsets=offsets,
    )


def test_launched_batches_keep_their_own_results() -> None:
    engine = Engine.load(MINILM_DIR, device="cuda")
    engine.warmup([1024, 2048, 4096])
    pipe = ResultPipeline(engine, engine.device, depth=2)
    outputs = [OutputOptions(), OutputOptions(dims=128, kind="int8"), OutputOptions(kind="binary")]
    batches = [_batch(i, seed=i, n=8 + 5 * i, outputs=outputs) for i in range(8)]
    want = []
    for b in batches:  # the synchronous reference, one batch at a time
        pooled = engine.embed(b.token_ids, b.offsets)
        groups = []
        for g, out in enumerate(outputs):
            rows = torch.from_numpy(np.flatnonzero(b.output_index == g)).cuda()
            groups.append(finalize(pooled[rows], out.dims, out.normalize, out.kind))
        want.append(groups)
    torch.cuda.synchronize()
    pending = []
    got = []
    for b in batches:  # two in flight at every step
        pending.append(pipe.launch(b))
        if len(pending) == 2:
            got.append(pipe.collect(pending.pop(0))[0])
    launched = list(pending)
    got += [pipe.collect(p)[0] for p in pending]
    # The stamps of the reply's worker_compute: results reach the host after the launch began.
    assert all(0 < p.started < p.ready_at for p in launched)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for a, b in zip(g, w, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, i
            if a.dtype == np.float32:
                np.testing.assert_allclose(a, b, atol=2e-3)
            else:  # quantized: equal but for rare rounding ties
                assert (a != b).mean() < 0.01, i


def test_the_default_gpu_budget_is_the_largest_graph_bucket() -> None:
    engine = Engine.load(MINILM_DIR, device="cuda")
    assert engine.runner is not None
    assert engine.max_batch_tokens == engine.runner.buckets[-1]
    assert engine.runner.bucket_for(engine.max_batch_tokens, 1) is not None


def test_an_idle_cuda_worker_answers_queries_on_its_link_thread_with_the_same_vectors() -> None:
    import threading

    import zmq

    from mesh.config import Liveness
    from mesh.worker.server import WorkerOptions, WorkerServer
    from proto_msgs import BatchResult, Heartbeat, ModelInfo, WorkerReady, decode, encode

    engine = Engine.load(MINILM_DIR, device="cuda")
    engine.warmup([16, 64])
    threads: list[str] = []
    run = engine.run

    def spy(batch: EngineBatch) -> EngineOutputs:
        threads.append(threading.current_thread().name)
        return run(batch)

    engine.run = spy  # type: ignore[method-assign]
    card = engine.card
    info = ModelInfo(
        "m", [], card.dims, card.max_input_tokens, engine.vocab_size, "mean", True, "0" * 64
    )
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("inproc://gpu-fake-broker")
    options = WorkerOptions("w", 2, 16384, 64, "cuda")
    server = WorkerServer(
        ctx, engine, info, b"{}", "inproc://gpu-fake-broker", options, Liveness(interval_s=0.5)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert router.poll(30_000)
        identity, *frames = router.recv_multipart()
        assert isinstance(decode(frames), WorkerReady)
        got = []
        query = BatchAssign(  # a 16-token query: its graph is warm, so it is quick
            batch_id=0,
            model="m",
            timeout_ms=60_000,
            outputs=[OutputOptions()],
            output_index=np.zeros(1, dtype=np.int32),
            token_ids=np.array([101, *range(2000, 2014), 102], dtype=np.int32),
            offsets=np.array([0, 16], dtype=np.int32),
        )
        for i in range(6):  # one at a time: idle whenever the next arrives
            query.batch_id = i
            router.send_multipart([identity, *encode(query)])
            while True:
                assert router.poll(30_000)
                reply = decode(router.recv_multipart()[1:])
                if not isinstance(reply, Heartbeat):
                    break
            assert isinstance(reply, BatchResult)
            got.append(reply.embeddings[0])
    finally:
        server.stop()
        thread.join(10)
        router.close(linger=0)
        ctx.destroy(linger=0)
    # The first (nothing timed yet) goes through the compute thread. In a fresh process a
    # thread's first runs can also be slow (pinned memory, its first CUDA calls: over the
    # 10 ms inline bound), which sends the next query through the threads again; once warm,
    # every idle query runs on the link thread.
    assert threads[0] != "broker-link" and threads[-3:] == ["broker-link"] * 3
    for g in got[1:]:  # the same query through the threads and the link: the same vector
        np.testing.assert_allclose(g, got[0], atol=1e-6)

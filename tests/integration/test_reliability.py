"""Failure injection on a real mesh: kill -9, broker loss, hung compute loops, garbage frames."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from mesh.client import MeshClient
from mesh.config import Liveness
from mesh.errors import DeadlineExceeded, Overloaded, Unavailable
from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.outputs import finalize
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus.jsonl"


def corpus_texts(n: int) -> list[str]:
    with CORPUS.open() as f:
        texts = [json.loads(line)["text"] for line in f]
    return texts[:n]


@pytest.fixture(scope="module")
def reference() -> Engine:
    return Engine.load(default_model_path(), threads=1)


def expected_batch(engine: Engine, tokenized: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Reference vectors of single-sequence inputs, computed in packed chunks of 100."""
    out = []
    for i in range(0, len(tokenized), 100):
        part = tokenized[i : i + 100]
        ids = np.concatenate([p[0] for p in part])
        lengths = np.array([len(p[0]) for p in part])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        out.append(finalize(engine.embed(ids, offsets), None, True, "float32"))
    return np.concatenate(out)


async def test_killing_one_of_two_workers_loses_no_request(mesh: Mesh, reference: Engine) -> None:
    mesh.start_broker()
    victim = mesh.start_worker()
    mesh.start_worker()
    texts = corpus_texts(500)
    # The client's own liveness is relaxed: this test is about the worker's death, and a loaded
    # 2-core CI machine can delay the client's event loop while two workers compute.
    client_liveness = Liveness(TEST_LIVENESS.interval_s, 4 * TEST_LIVENESS.liveness)
    async with MeshClient(mesh.frontend, liveness=client_liveness) as client:
        await wait_for_workers(client, 2)
        tokenized = [await client.tokenize([t], MODEL, truncate=True) for t in texts]
        tasks = [
            asyncio.create_task(client.embed_tokens(ids, offs, MODEL, timeout_s=120))
            for ids, offs in tokenized
        ]
        # Kill once work is flowing, so batches are in flight on the victim.
        while sum(t.done() for t in tasks) < 20:
            await asyncio.sleep(0.01)
        os.kill(victim.pid, signal.SIGKILL)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} failed, first: {failures[0]!r}\n{mesh.logs()}"
    assert "requeueing" in mesh.logs()  # the victim really held work when it died
    want = expected_batch(reference, tokenized)
    got = np.concatenate([r.embeddings for r in results])
    assert got.shape == (500, 384)
    assert float(np.min(np.sum(want * got, axis=1))) >= 0.9999


async def test_lost_broker_fails_pending_calls_then_recovers(mesh: Mesh) -> None:
    mesh.start_broker()
    # A worker that hangs at once keeps every call pending until the broker dies.
    mesh.start_worker(hang_after=0)
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        calls = [asyncio.create_task(client.embed([f"pending {i}"], MODEL)) for i in range(5)]
        await asyncio.sleep(0.5)
        assert not any(c.done() for c in calls)
        mesh.broker.kill()  # type: ignore[union-attr]
        killed_at = time.monotonic()
        results = await asyncio.gather(*calls, return_exceptions=True)
        waited = time.monotonic() - killed_at
        assert all(isinstance(r, Unavailable) for r in results), results
        # Within the liveness window (plus one interval of slack for the ping loop).
        assert waited <= TEST_LIVENESS.expiry_s + 2 * TEST_LIVENESS.interval_s + 1.0
        with pytest.raises(Unavailable):
            await client.embed(["while the broker is down"], MODEL)
        # Same endpoints again: workers re-register, calls succeed.
        for proc in mesh.workers:
            proc.kill()
        mesh.start_broker()
        mesh.start_worker()
        await client.wait_ready(60, MODEL)
        result = await client.embed(["the broker is back"], MODEL, timeout_s=30)
        assert result.embeddings.shape == (1, 384)


async def test_worker_reregisters_with_a_restarted_broker(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker()
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        first = client.brokers[0].instance
        assert first is not None
        mesh.broker.kill()  # type: ignore[union-attr]
        mesh.broker.wait()  # type: ignore[union-attr]
        mesh.start_broker()
        deadline = time.monotonic() + 30
        while client.brokers[0].instance in (None, first) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert client.brokers[0].instance not in (None, first)
        await wait_for_workers(client, 1, timeout_s=40)
        result = await client.embed(["same worker, new broker"], MODEL, timeout_s=30)
        assert result.embeddings.shape == (1, 384)


async def test_hung_worker_is_caught_by_the_batch_deadline(mesh: Mesh) -> None:
    # The orphan grace covers the healthy worker's start: if the hung one is buried before the
    # healthy one has loaded its model (a loaded 2-core host), the work waits for it, as under
    # --role all, instead of failing as a model left without workers.
    mesh.start_broker("--batch-timeout", "2", "--orphan-grace", "60")
    mesh.start_worker(hang_after=0)
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        call = asyncio.create_task(client.embed(["stuck on a hung worker"], MODEL, timeout_s=60))
        await asyncio.sleep(0.5)
        mesh.start_worker()  # a healthy worker; the batch must move to it
        result = await call
        assert result.embeddings.shape == (1, 384)
    assert "overdue" in mesh.logs()


async def test_a_hung_worker_exits_for_a_fresh_one_and_its_work_finishes(mesh: Mesh) -> None:
    """The watchdog: a worker process holding a batch it never answers exits with code 70
    (its stacks in the log); the work it held is requeued and a fresh worker finishes it."""
    from mesh.worker.server import EXIT_HUNG

    mesh.start_broker("--orphan-grace", "60")
    hung = mesh.start_worker("--watchdog-s", "2", hang_after=0)
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        call = asyncio.create_task(client.embed(["held by a hung worker"], MODEL, timeout_s=90))
        code = await asyncio.to_thread(hung.wait, 60)
        assert code == EXIT_HUNG, mesh.logs()
        mesh.start_worker()  # what the supervisor does after the exit
        result = await call
        assert result.embeddings.shape == (1, 384)
    # The whole log: the stack dump after the message can be longer than logs()'s tail.
    logs = mesh.logs(tail=None)
    assert "hung: 1 batches held" in logs and "Thread 0x" in logs


async def test_cancel_and_deadline_remove_queued_work(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker(hang_after=0)  # nothing ever completes: work stays queued
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        blockers = [asyncio.create_task(client.embed([f"b{i}"], MODEL)) for i in range(2)]
        await asyncio.sleep(0.3)  # both credits taken; what follows queues
        to_cancel = asyncio.create_task(client.embed(["cancel me " * 50], MODEL))
        await asyncio.sleep(0.3)
        before = client.brokers[0].stats
        assert before is not None and before.queued_sequences[MODEL] == 1
        to_cancel.cancel()
        with pytest.raises(asyncio.CancelledError):
            await to_cancel
        await asyncio.sleep(3 * TEST_LIVENESS.interval_s)
        assert client.brokers[0].stats.queued_sequences[MODEL] == 0  # type: ignore[union-attr]

        with pytest.raises(DeadlineExceeded):
            await client.embed(["expire me"], MODEL, timeout_s=0.5)
        await asyncio.sleep(3 * TEST_LIVENESS.interval_s)
        assert client.brokers[0].stats.queued_sequences[MODEL] == 0  # type: ignore[union-attr]
        for b in blockers:
            b.cancel()
        await asyncio.gather(*blockers, return_exceptions=True)


async def test_overload_is_refused_fast(mesh: Mesh) -> None:
    mesh.start_broker("--max-queued-tokens", "300")
    mesh.start_worker(hang_after=0)
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        ids = np.full(100, 1000, dtype=np.int32)
        offs = np.array([0, 100], dtype=np.int32)
        held = [asyncio.create_task(client.embed_tokens(ids, offs, MODEL)) for _ in range(5)]
        await asyncio.sleep(0.5)  # 2 in flight, 3 x 100 tokens queued: full
        started = time.monotonic()
        with pytest.raises(Overloaded) as info:
            await client.embed_tokens(ids, offs, MODEL)
        assert time.monotonic() - started < 1.0
        assert info.value.retry_after_s is not None and info.value.retry_after_s > 0
        for h in held:
            h.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_garbage_frames_are_counted_and_ignored(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker()
    ctx = zmq.Context.instance()
    garbage = [
        [b"hello"],
        [b"\xe3m\x01\x01", b"not msgpack \xff\xfe"],
        [b"\xe3m\x09\x01", b"\x80"],  # wrong version
        [b"\xe3m\x01\x7f", b"\x80"],  # unknown command
        [b"\xe3m\x01\x01", b"\x81\xa3cid\x07"],  # a submit missing every field but cid
        [os.urandom(64) for _ in range(3)],
    ]
    async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        for endpoint in (mesh.frontend, mesh.backend):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            for frames in garbage:
                sock.send_multipart(frames)
            time.sleep(0.2)
            sock.close()
        result = await client.embed(["still serving after garbage"], MODEL, timeout_s=30)
        assert result.embeddings.shape == (1, 384)
        await asyncio.sleep(2 * TEST_LIVENESS.interval_s)
        stats = client.brokers[0].stats
        assert stats is not None and stats.dropped_frames >= 2 * len(garbage) - 2
        assert stats.workers[MODEL] == 1


async def test_tcp_loopback_mesh_serves(tcp_mesh: Mesh) -> None:
    tcp_mesh.start_broker()
    tcp_mesh.start_worker()
    async with MeshClient(tcp_mesh.frontend, liveness=TEST_LIVENESS) as client:
        await wait_for_workers(client, 1)
        result = await client.embed(["over tcp"] * 3, MODEL, timeout_s=30)
        assert result.embeddings.shape == (3, 384)
        assert np.allclose(result.embeddings[0], result.embeddings[2])
        # Results report the broker queue wait and the worker's compute time.
        assert result.compute_ms > 0 and result.queue_ms >= 0


def test_worker_ignores_garbage_from_its_broker(tmp_path: Path) -> None:
    """A fake broker sends garbage, then a real batch: the worker answers the batch."""
    from proto_msgs import BatchAssign, BatchResult, OutputOptions, WorkerReady, decode, encode

    mesh = Mesh(tmp_path)
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(mesh.backend)
    mesh.start_worker()
    try:
        assert router.poll(60_000), mesh.logs()
        identity, *frames = router.recv_multipart()
        assert isinstance(decode(frames), WorkerReady)
        for junk in ([b"x"], [b"\xe3m\x01\x11", b"\x80"], [os.urandom(4), os.urandom(9)]):
            router.send_multipart([identity, *junk])
        batch = BatchAssign(
            batch_id=7,
            model=MODEL,
            timeout_ms=30_000,
            outputs=[OutputOptions()],
            output_index=np.zeros(1, dtype=np.int32),
            token_ids=np.array([101, 7592, 102], dtype=np.int32),
            offsets=np.array([0, 3], dtype=np.int32),
        )
        router.send_multipart([identity, *encode(batch)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert router.poll(30_000)
            _, *frames = router.recv_multipart()
            msg = decode(frames)
            if isinstance(msg, BatchResult):
                assert msg.batch_id == 7 and msg.embeddings[0].shape == (1, 384)
                break
        else:
            pytest.fail("no result from the worker")
    finally:
        mesh.stop()
        router.close()

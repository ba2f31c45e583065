"""The broker's sockets as a trust boundary, on a real mesh: what a peer sends fails only itself."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import zmq

from mesh.client import MeshClient
from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    Disconnect,
    ErrorCode,
    Heartbeat,
    ModelInfo,
    OutputOptions,
    RequestError,
    SubmitRequest,
    WorkerReady,
    decode,
    encode,
)
from tests.integration.conftest import MODEL, TEST_LIVENESS, Mesh, wait_for_workers


def raw_dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def raw_submit(cid: int, token: int, dims: int | None) -> SubmitRequest:
    ids = np.array([101, token, 102], dtype=np.int32)
    return SubmitRequest(
        cid=cid,
        model=MODEL,
        lane=0,
        timeout_ms=30_000,
        output=OutputOptions(dims=dims),
        token_ids=ids,
        offsets=np.array([0, len(ids)], dtype=np.int32),
    )


async def test_a_bad_raw_submit_among_valid_concurrent_ones_fails_alone(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker()
    raw = raw_dealer(mesh.frontend)
    try:
        async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
            await wait_for_workers(client, 1)
            ids, offsets = await client.tokenize(
                ["a valid request of a few words " * 20] * 4, MODEL
            )

            def valid() -> asyncio.Task:
                return asyncio.create_task(client.embed_tokens(ids, offsets, MODEL, timeout_s=60))

            first = [valid() for _ in range(60)]
            while sum(t.done() for t in first) < 5:  # the worker is busy, the queue is full
                await asyncio.sleep(0.005)
            raw.send_multipart(encode(raw_submit(1, 10**6, None)))  # outside the vocabulary
            raw.send_multipart(encode(raw_submit(2, 2000, 1000)))  # wider than 384
            valid_tasks = first + [valid() for _ in range(60)]
            results = await asyncio.gather(*valid_tasks, return_exceptions=True)
            errors: dict[int, RequestError] = {}
            while len(errors) < 2 and raw.poll(10_000):
                msg = decode(raw.recv_multipart())
                assert isinstance(msg, RequestError), msg
                errors[msg.cid] = msg
    finally:
        raw.close()
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} valid requests failed: {failures[0]!r}\n{mesh.logs()}"
    assert all(r.embeddings.shape == (4, 384) for r in results)
    assert sorted(errors) == [1, 2], mesh.logs()
    assert {e.code for e in errors.values()} == {ErrorCode.INVALID_INPUT}
    assert "vocabulary" in errors[1].message and "dimensions" in errors[2].message


def fake_card() -> ModelInfo:
    return ModelInfo(
        name="fake-model",
        aliases=[],
        dims=4,
        max_input_tokens=8,
        vocab_size=10,
        pooling="mean",
        normalize=True,
        tokenizer_digest=hashlib.sha256(b"{}").hexdigest(),
    )


async def test_crafted_worker_messages_leave_the_broker_serving(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker()
    fake, front = raw_dealer(mesh.backend), raw_dealer(mesh.frontend)
    try:
        async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
            await wait_for_workers(client, 1)
            # A peer on the backend announces a model of its own and is sent a batch of it.
            ready = WorkerReady("fake", fake_card(), b"{}", 64, 8, 1, 250, "cpu")
            fake.send_multipart(encode(ready))
            submit = raw_submit(1, 3, None)
            submit.model, submit.token_ids[:] = "fake-model", 1
            # Registered (in the catalog) and heard just now, so its 250 ms heartbeat expiry
            # cannot lapse before the batch is sent, however loaded the test host is.
            for _ in range(200):
                if any(m.name == "fake-model" for m in client.models()):
                    break
                await asyncio.sleep(0.05)
            fake.send_multipart(encode(Heartbeat(progress=0, busy=False)))
            front.send_multipart(encode(submit))
            batch = None
            while not isinstance(batch, BatchAssign):  # heartbeats come first
                assert fake.poll(10_000), mesh.logs()
                batch = decode(fake.recv_multipart())
            crafted = [
                BatchError(batch.batch_id, 999, "a code no one knows", False),
                BatchResult(batch.batch_id + 12345, 1.0, [np.ones((1, 4), np.float32)]),
                BatchResult(batch.batch_id, 1.0, [np.ones((7, 4), np.float32)] * 3),
            ]
            for msg in crafted:
                fake.send_multipart(encode(msg))
            result = await client.embed(["the broker still serves"], MODEL, timeout_s=30)
            assert result.embeddings.shape == (1, 384)
            await asyncio.sleep(2 * TEST_LIVENESS.interval_s)
            stats = client.brokers[0].stats
            assert stats is not None and stats.dropped_frames >= 2, stats
    finally:
        fake.close()
        front.close()
    assert mesh.broker is not None and mesh.broker.poll() is None, mesh.logs()


async def test_a_ready_conflicting_with_a_served_card_is_refused(mesh: Mesh) -> None:
    mesh.start_broker()
    mesh.start_worker()
    impostor = raw_dealer(mesh.backend)
    try:
        async with MeshClient(mesh.frontend, liveness=TEST_LIVENESS) as client:
            await wait_for_workers(client, 1)
            served = {m.name: m for m in client.models()}[MODEL]
            card = fake_card()
            card.name, card.dims = MODEL, 1
            impostor.send_multipart(
                encode(WorkerReady("impostor", card, b"{}", 64, 8, 1, 250, "x"))
            )
            reply = None
            while not isinstance(reply, Disconnect):
                assert impostor.poll(10_000), mesh.logs()
                reply = decode(impostor.recv_multipart())
            assert "dims" in reply.reason and "tokenizer_digest" in reply.reason
            await asyncio.sleep(2 * TEST_LIVENESS.interval_s)  # a catalog refresh or two
            now = {m.name: m for m in client.models()}[MODEL]
            assert (now.dims, now.vocab_size, now.workers) == (served.dims, served.vocab_size, 1)
            result = await client.embed(["served by the first card"], MODEL, timeout_s=30)
            assert result.embeddings.shape == (1, 384)
    finally:
        impostor.close()

"""The broker's sockets as a trust boundary, on a real mesh: what a peer sends fails only itself."""

from __future__ import annotations

import asyncio

import numpy as np
import zmq

from mesh.client import MeshClient
from proto_msgs import (
    ErrorCode,
    OutputOptions,
    RequestError,
    SubmitRequest,
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

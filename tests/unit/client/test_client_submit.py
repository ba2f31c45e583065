"""MeshClient.submit's wait: its own deadline, the caller giving up, and an answer, each ending
the request once, with the broker told to drop what the client gave up and nothing left pending.
The test plays the broker on a ROUTER; the link's reader and pinger are not started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
import zmq

from mesh.client import MeshClient
from mesh.config import Liveness
from mesh.errors import DeadlineExceeded, Unavailable
from proto_msgs import (
    CancelRequest,
    ErrorCode,
    Message,
    ModelInfo,
    RequestError,
    RequestResult,
    SubmitRequest,
    decode,
)

MODEL = ModelInfo(
    name="tiny", aliases=[], dims=4, max_input_tokens=8, vocab_size=100,
    pooling="mean", normalize=True, tokenizer_digest="d", workers=1,
)  # fmt: skip


@pytest.fixture
async def mesh() -> AsyncIterator[tuple[MeshClient, zmq.asyncio.Socket]]:
    client = MeshClient("inproc://submit", liveness=Liveness(interval_s=0.02, liveness=1))
    broker = client._ctx.socket(zmq.ROUTER)
    broker.bind("inproc://submit")
    link = client.brokers[0]
    link._open()
    link.alive, link.models = True, [MODEL]
    yield client, broker
    broker.close(linger=0)
    await client.close()


async def received(broker: zmq.asyncio.Socket) -> Message:
    frames = await asyncio.wait_for(broker.recv_multipart(), 5)
    return decode(frames[1:])


async def started(
    client: MeshClient, broker: zmq.asyncio.Socket, timeout_s: float
) -> tuple[asyncio.Task[object], Message]:
    """A two-token request submitted in a task of its own, and what the broker received."""
    request = client.prepare_tokens(np.array([1, 2]), np.array([0, 2]), "tiny")
    call = asyncio.create_task(client.submit(request, timeout_s=timeout_s))
    return call, await received(broker)


def nothing_pending(client: MeshClient) -> bool:
    return not client.brokers[0]._pending and client.brokers[0].outstanding_tokens == 0


async def test_no_answer_by_the_deadline_is_deadline_exceeded_and_cancelled_at_the_broker(
    mesh: tuple[MeshClient, zmq.asyncio.Socket],
) -> None:
    client, broker = mesh
    request = client.prepare_tokens(np.array([1, 2]), np.array([0, 2]), "tiny")
    # The client's own deadline: timeout_s plus one liveness window (0.02 s here).
    with pytest.raises(DeadlineExceeded, match="no result within 0.01s"):
        await client.submit(request, timeout_s=0.01)
    submitted = await received(broker)
    assert isinstance(submitted, SubmitRequest)
    assert await received(broker) == CancelRequest(cid=submitted.cid)
    assert nothing_pending(client)


async def test_a_caller_that_gives_up_cancels_the_request_at_the_broker(
    mesh: tuple[MeshClient, zmq.asyncio.Socket],
) -> None:
    client, broker = mesh
    call, submitted = await started(client, broker, 30)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await received(broker) == CancelRequest(cid=submitted.cid)
    assert nothing_pending(client)


async def test_an_answered_request_returns_its_rows_and_sends_no_cancel(
    mesh: tuple[MeshClient, zmq.asyncio.Socket],
) -> None:
    client, broker = mesh
    # The answer must come before the client's deadline: 0.5 s leaves a loaded host room
    # between the submit and the answer (0.05 s + 0.02 s did not always).
    call, submitted = await started(client, broker, 0.5)
    rows = np.ones((1, 4), np.float32)
    client.brokers[0]._dispatch(
        RequestResult(
            cid=submitted.cid, prompt_tokens=2, indices=np.zeros(1, np.int32), embeddings=rows
        )
    )
    result = await call
    assert result.embeddings.tolist() == rows.tolist() and result.prompt_tokens == 2
    await asyncio.sleep(0.6)  # past the client's deadline: its timer was cancelled
    assert not await broker.poll(0) and nothing_pending(client)


async def test_a_broker_that_no_longer_lists_the_model_is_unavailable_not_not_found(
    mesh: tuple[MeshClient, zmq.asyncio.Socket],
) -> None:
    # The broker restarted between the pick and the submit: its catalog is empty until its
    # workers register again, and it answers MODEL_NOT_FOUND. The client picked it because
    # its catalog listed the model, so the caller is told to retry (503), not 404.
    client, broker = mesh
    call, submitted = await started(client, broker, 5)
    message = "model 'tiny' is not served"
    client.brokers[0]._dispatch(RequestError(submitted.cid, ErrorCode.MODEL_NOT_FOUND, message))
    with pytest.raises(Unavailable, match="no longer serves 'tiny'.*retry"):
        await call
    assert nothing_pending(client)

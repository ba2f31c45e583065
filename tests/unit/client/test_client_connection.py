"""Result assembly in the client: chunks by index, duplicates dropped, per-hop timings merged."""

from __future__ import annotations

import asyncio
import errno

import numpy as np
import pytest
import zmq
import zmq.asyncio

from mesh.client.connection import READ_BATCH, BrokerConnection, _Pending
from mesh.config import Liveness
from mesh.errors import ProtocolViolation
from proto_msgs import (
    BrokerStats,
    OutputOptions,
    Ping,
    Pong,
    ProtocolError,
    RequestResult,
    SubmitRequest,
    decode,
    encode,
)


def chunk(indices: list[int], timings: dict[str, float], tokens: int = 3) -> RequestResult:
    rows = np.array(indices, dtype=np.float32)[:, None] * np.ones((1, 4), dtype=np.float32)
    return RequestResult(
        cid=1, prompt_tokens=tokens, indices=np.array(indices, dtype=np.int32), embeddings=rows,
        queue_ms=1.0, compute_ms=2.0, timings=timings,
    )  # fmt: skip


async def test_timings_are_the_largest_per_hop_over_chunks_plus_the_clients_own() -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=3, tokens=9)
    assert not pending.add(chunk([0, 2], {"worker_compute": 4.0, "broker_in": 0.5}))
    assert pending.add(chunk([1], {"worker_compute": 3.0, "broker_in": 0.7, "broker_out": 0.1}))
    result = pending.result()
    assert result.embeddings[:, 0].tolist() == [0.0, 1.0, 2.0] and result.prompt_tokens == 6
    assert {k: v for k, v in result.timings.items() if k != "client_mesh"} == {
        "worker_compute": 4.0, "broker_in": 0.7, "broker_out": 0.1,
    }  # fmt: skip
    assert result.timings["client_mesh"] >= 0


async def test_a_duplicate_chunk_adds_neither_rows_nor_timings() -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=2, tokens=6)
    pending.add(chunk([0], {"worker_compute": 1.0}))
    pending.add(chunk([0], {"worker_compute": 50.0}))  # a requeued batch answered twice
    assert pending.add(chunk([1], {"worker_compute": 2.0}))
    result = pending.result()
    assert result.timings["worker_compute"] == 2.0 and result.prompt_tokens == 6


@pytest.mark.parametrize("n", [1, 3, 40])
async def test_one_chunk_of_every_sequence_in_order_is_the_answer_copied(n: int) -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=n, tokens=n)
    whole = decode(encode(chunk(list(range(n)), {"worker_compute": 1.0}, tokens=n)))
    assert pending.add(whole)
    result = pending.result()
    assert result.embeddings[:, 0].tolist() == list(range(n)) and result.prompt_tokens == n
    assert result.embeddings.flags.writeable and result.embeddings.flags.c_contiguous
    assert result.timings["worker_compute"] == 1.0 and pending.received.all()


async def test_a_whole_chunk_after_part_of_the_answer_keeps_the_rows_already_there() -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=2, tokens=6)
    assert not pending.add(chunk([0], {}))
    late = chunk([0, 1], {})  # a requeued batch, answered again in another cut
    late.embeddings = late.embeddings + 10.0
    assert pending.add(late)
    assert pending.result().embeddings[:, 0].tolist() == [0.0, 11.0]


async def test_every_sequence_out_of_order_still_lands_by_index() -> None:
    pending = _Pending(future=asyncio.get_running_loop().create_future(), n=3, tokens=9)
    assert pending.add(chunk([2, 0, 1], {}))
    assert pending.result().embeddings[:, 0].tolist() == [0.0, 1.0, 2.0]


async def test_sparse_chunks_of_other_widths_widen_each_half_with_pads() -> None:
    """Each batch sends rows as wide as the most weights one of its rows kept."""
    pending = _Pending(asyncio.get_running_loop().create_future(), n=3, tokens=9, sparse=True)

    def sparse(indices: list[int], rows: list[list[float]]) -> RequestResult:
        return RequestResult(cid=1, prompt_tokens=3, indices=np.array(indices, dtype=np.int32),
                             embeddings=np.array(rows, dtype=np.float32))  # fmt: skip

    assert not pending.add(sparse([0], [[7, 0.5]]))  # k = 1: id 7, weight 0.5
    assert not pending.add(sparse([2], [[1, 4, 9, 0.25, 0.75, 1.0]]))  # k = 3
    assert pending.add(sparse([1], [[2, 3, 0.125, 2.0]]))  # k = 2
    assert pending.result().embeddings.tolist() == [
        [7, 0, 0, 0.5, 0, 0], [2, 3, 0, 0.125, 2.0, 0], [1, 4, 9, 0.25, 0.75, 1.0],
    ]  # fmt: skip
    dense = _Pending(asyncio.get_running_loop().create_future(), n=2, tokens=6)
    dense.add(sparse([0], [[7, 0.5]]))
    with pytest.raises(ProtocolError, match="disagree on width"):
        dense.add(sparse([1], [[2, 3, 0.125, 2.0]]))


class _Linked:
    """A BrokerConnection alive against a fake broker (a plain ROUTER this test drives)."""

    def __init__(self, conn, broker, identity: bytes) -> None:  # noqa: ANN001
        self.conn, self.broker, self.identity = conn, broker, identity

    def submit(self) -> tuple[int, asyncio.Future]:
        """One one-token request sent; its cid and future."""
        request = SubmitRequest(
            cid=self.conn.next_cid(), model="m", lane=0, timeout_ms=None, output=OutputOptions(),
            token_ids=np.array([5], dtype=np.int32), offsets=np.array([0, 1], dtype=np.int32),
        )  # fmt: skip
        return request.cid, self.conn.submit(request, tokens=1).future

    def answer(self, cid: int, index: int = 0) -> None:
        result = RequestResult(
            cid=cid, prompt_tokens=1, indices=np.array([index], dtype=np.int32),
            embeddings=np.full((1, 4), cid, dtype=np.float32),
        )  # fmt: skip
        self.broker.send_multipart([self.identity, *encode(result)])


@pytest.fixture
async def linked(tmp_path):  # noqa: ANN001, ANN201
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/f"
    broker = zmq.Context.instance().socket(zmq.ROUTER)
    broker.bind(endpoint)
    # Pings every 60 s: none comes to wake the reader within a test's wait.
    conn = BrokerConnection(ctx, endpoint, Liveness(interval_s=60.0))
    try:
        await conn.start()
        for _ in range(500):  # the connection pings at start
            if broker.poll(0):
                break
            await asyncio.sleep(0.01)
        frames = broker.recv_multipart(copy=False)
        identity, ping = frames[0].bytes, decode(frames[1:])
        broker.send_multipart([identity, *encode(Pong(ping.cid, BrokerStats(), instance=1))])
        assert await conn.wait_alive(5.0)
        yield _Linked(conn, broker, identity)
    finally:
        await conn.close()
        broker.close(linger=0)
        ctx.term()


async def test_a_burst_of_results_larger_than_one_read_all_arrive(linked: _Linked) -> None:
    """The connection reads its socket from the loop's reader callback, at most READ_BATCH
    messages a wake-up, and zmq's descriptor signals edges only: every result of a burst
    several times that size must still resolve its request, without another message to wake
    the reader (a missed edge would leave them waiting for good)."""
    pending = [linked.submit() for _ in range(3 * READ_BATCH + 7)]
    for cid, _ in pending:  # answered all at once, while the loop is busy here
        linked.answer(cid)
    results = await asyncio.wait_for(asyncio.gather(*(f for _, f in pending)), timeout=5)
    assert [int(r.embeddings[0, 0]) for r in results] == [cid for cid, _ in pending]
    assert linked.conn.outstanding_tokens == 0


async def test_a_result_that_does_not_fit_its_request_fails_it_at_once(linked: _Linked) -> None:
    """A chunk whose index is out of its request's range decodes fine and fails when it is
    added: that request fails then (ProtocolViolation), not at its deadline, and the next
    request is served."""
    cid, bad = linked.submit()
    linked.answer(cid, index=3)  # the request has one sequence: index 3 does not exist
    with pytest.raises(ProtocolViolation, match="malformed reply"):
        await asyncio.wait_for(bad, timeout=5)
    cid, good = linked.submit()
    linked.answer(cid)
    assert (await asyncio.wait_for(good, timeout=5)).embeddings.shape == (1, 4)
    assert linked.conn.outstanding_tokens == 0 and linked.conn.dropped == 1


async def test_a_closed_link_refuses_requests_as_unavailable(linked: _Linked) -> None:
    from mesh.errors import Unavailable

    await linked.conn.close()
    with pytest.raises(Unavailable):
        linked.submit()
    with pytest.raises(Unavailable):
        linked.conn._send(Pong(1, BrokerStats()))  # what the pinger or a cancel would send


async def test_a_lost_link_that_cannot_open_a_socket_keeps_the_old_one_and_tries_again(
    linked: _Linked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of file descriptors when the broker went silent: the link keeps its old socket
    (and its pinger, which an exception would have ended) and opens a fresh one at a later
    interval, closing the old one then."""
    conn = linked.conn
    old = conn._sock
    real_socket = conn.ctx.socket
    failures = [zmq.ZMQError(errno.EMFILE)]

    def socket(*args: object, **kwargs: object) -> zmq.Socket:
        if failures:
            raise failures.pop()
        return real_socket(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(conn.ctx, "socket", socket)
    conn._lost()
    assert conn._sock is old and not old.closed and conn._reopen and not conn.alive
    conn._replace_socket()  # what the pinger does at its next interval
    assert conn._sock is not old and old.closed and not conn._reopen
    conn._send(Ping(cid=conn.next_cid()))  # the fresh socket reaches the broker
    seen = []  # (what came, from the old peer?): the old socket's catalog request came first
    while linked.broker.poll(5000):
        identity, *frames = linked.broker.recv_multipart()
        seen.append((type(decode(frames)).__name__, identity == linked.identity))
        if seen[-1][0] == "Ping":
            break
    assert seen[-1] == ("Ping", False), seen


async def test_a_socket_whose_monitor_cannot_be_watched_is_closed_with_its_monitor(
    linked: _Linked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a fresh socket fails after its monitor was made (the loop refuses the
    monitor's descriptor): the half-built socket and its monitor are both closed and no
    reader is left on the socket's descriptor; the old socket stays, to be replaced later."""
    from mesh.client import connection

    conn = linked.conn
    old = conn._sock
    loop = asyncio.get_running_loop()
    made: list[tuple[zmq.Socket, zmq.Socket, int]] = []
    real_monitor, real_add_reader = connection.disconnect_monitor, loop.add_reader

    def disconnect_monitor(sock: zmq.Socket) -> zmq.Socket:
        made.append((sock, real_monitor(sock), sock.FD))
        return made[-1][1]

    def add_reader(fd: int, callback: object, *args: object) -> None:
        if made and fd == made[-1][1].FD:
            raise OSError(errno.EMFILE, "no room for another descriptor")
        real_add_reader(fd, callback, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(connection, "disconnect_monitor", disconnect_monitor)
    monkeypatch.setattr(loop, "add_reader", add_reader)
    conn._lost()
    ((sock, monitor, fd),) = made
    assert sock.closed and monitor.closed, "the half-built socket or its monitor leaked"
    assert not loop.remove_reader(fd), "a reader was left on the closed socket's descriptor"
    assert conn._sock is old and not old.closed and conn._reopen


async def test_a_broker_whose_connection_closes_fails_its_requests_at_once(
    linked: _Linked,
) -> None:
    """Its process died (the socket closed): the socket monitor sees the disconnect, and the
    request fails with Unavailable now, not a liveness window (here 3 minutes) later."""
    from mesh.errors import Unavailable

    _, future = linked.submit()
    linked.broker.close(linger=0)
    with pytest.raises(Unavailable, match="lost the broker"):
        await asyncio.wait_for(future, timeout=5)
    assert not linked.conn.alive and linked.conn.outstanding_tokens == 0


async def test_a_restart_and_a_loss_each_count_as_a_failover_and_the_link_stays_sound(
    linked: _Linked,
) -> None:
    conn = linked.conn
    assert (conn.failovers, conn.sound()) == (0, True)
    assert conn.heard_ago() is not None and conn.heard_ago() < 5
    pong = Pong(conn.next_cid(), BrokerStats(), instance=2)  # another broker process answers
    linked.broker.send_multipart([linked.identity, *encode(pong)])
    for _ in range(500):
        if conn.instance == 2:
            break
        await asyncio.sleep(0.01)
    assert conn.failovers == 1
    conn._lost("a test")
    assert conn.failovers == 2 and not conn.alive and conn.sound()
    await conn.close()
    assert not conn.sound()  # its pinger ended: only a new link would ping again

"""``MeshClient(prefetch_tokenizers=True)`` (the ingress's): a served model's tokenizer is
fetched when a catalog lists it, before any request, so that the first request does not pay
the fetch and the tokenizer processes' start-up; a plain client fetches nothing it was not
asked for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import zmq

from mesh.client import MeshClient
from mesh.config import Liveness
from mesh.errors import Unavailable
from mesh.worker.engine.card import default_model_path, read_card
from proto_msgs import (
    BrokerStats,
    CatalogReply,
    CatalogRequest,
    ModelInfo,
    Ping,
    Pong,
    TokenizerReply,
    TokenizerRequest,
    decode,
    encode,
)

CARD = read_card(default_model_path())
MODEL = ModelInfo(
    name="m", aliases=[], dims=CARD.dims, max_input_tokens=CARD.max_input_tokens,
    vocab_size=30522, pooling="mean", normalize=True, tokenizer_digest="digest-1", workers=1,
)  # fmt: skip


class StandInBroker:
    """A ROUTER answering pings, catalog and tokenizer requests; it records what it was asked."""

    def __init__(self, endpoint: str) -> None:
        self.asked: list[str] = []
        self.has_tokenizer = True  # False: TokenizerReply(found=False)
        self.tokenizer_delay_s = 0.0  # before answering a TokenizerRequest
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(20):
                continue
            identity, *frames = self._sock.recv_multipart()
            msg = decode(frames)
            self.asked.append(type(msg).__name__)
            reply = None
            if isinstance(msg, Ping):
                reply = Pong(msg.cid, BrokerStats(), instance=1)
            elif isinstance(msg, CatalogRequest):
                reply = CatalogReply(msg.cid, [MODEL])
            elif isinstance(msg, TokenizerRequest):
                self._stop.wait(self.tokenizer_delay_s)
                found = self.has_tokenizer and msg.digest == MODEL.tokenizer_digest
                reply = TokenizerReply(
                    msg.cid, msg.digest, found, CARD.tokenizer_json if found else b""
                )
            if reply is not None:
                self._sock.send_multipart([identity, *encode(reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(linger=0)


@pytest.fixture
def broker(tmp_path) -> Iterator[tuple[StandInBroker, str]]:  # noqa: ANN001
    endpoint = f"ipc://{tmp_path}/front"
    stand_in = StandInBroker(endpoint)
    try:
        yield stand_in, endpoint
    finally:
        stand_in.close()


async def _until(check, seconds: float = 10.0) -> bool:  # noqa: ANN001
    for _ in range(int(seconds / 0.02)):
        if check():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_the_ingress_client_has_the_tokenizer_before_its_first_request(broker) -> None:
    stand_in, endpoint = broker
    async with MeshClient(
        endpoint, liveness=Liveness(interval_s=0.2), prefetch_tokenizers=True
    ) as client:
        key = f"{MODEL.tokenizer_digest}:{MODEL.max_input_tokens}"
        assert await _until(lambda: client.tokenizers.get(key) is not None)
        asks = stand_in.asked.count("TokenizerRequest")
        # Fetched once, however many catalogs arrive (one per heartbeat) ...
        await asyncio.sleep(0.6)
        assert stand_in.asked.count("TokenizerRequest") == asks == 1
        # ... and the first request tokenizes with it, asking the broker nothing more.
        valid = await client.prepare_texts(["hello world"], "m")
        assert valid.n == 1 and stand_in.asked.count("TokenizerRequest") == 1


async def test_a_plain_client_fetches_no_tokenizer_it_was_not_asked_for(broker) -> None:
    stand_in, endpoint = broker
    async with MeshClient(endpoint, liveness=Liveness(interval_s=0.2)) as client:
        assert await _until(lambda: "CatalogRequest" in stand_in.asked)
        await asyncio.sleep(0.6)  # several catalogs
        assert "TokenizerRequest" not in stand_in.asked
        await client.prepare_texts(["hello world"], "m")
        assert stand_in.asked.count("TokenizerRequest") == 1


async def test_a_failing_prefetch_is_said_once_and_not_asked_again_every_heartbeat(
    broker, caplog
) -> None:
    stand_in, endpoint = broker
    stand_in.has_tokenizer = False  # e.g. a broker restarted without the file
    async with MeshClient(
        endpoint, liveness=Liveness(interval_s=0.1), prefetch_tokenizers=True
    ) as client:
        assert await _until(lambda: "TokenizerRequest" in stand_in.asked)
        catalogs = stand_in.asked.count("CatalogRequest")
        await asyncio.sleep(1.0)  # about ten more catalogs
        assert stand_in.asked.count("CatalogRequest") >= catalogs + 5
        assert stand_in.asked.count("TokenizerRequest") == 1  # retried after 30 s, not each
        warned = [r for r in caplog.records if "could not prefetch" in r.getMessage()]
        assert len(warned) == 1
        # A request still asks (and fails clearly) instead of waiting for the retry.
        with pytest.raises(Unavailable, match="tokenizer"):
            await client.prepare_texts(["hello"], "m")
        assert stand_in.asked.count("TokenizerRequest") == 2


async def test_closing_with_a_prefetch_in_flight_cancels_it(broker) -> None:
    stand_in, endpoint = broker
    stand_in.tokenizer_delay_s = 0.5
    client = MeshClient(endpoint, liveness=Liveness(interval_s=0.2), prefetch_tokenizers=True)
    await client.start()
    assert await _until(lambda: "TokenizerRequest" in stand_in.asked)
    fetches = list(client._fetcher._fetches.values())
    assert fetches
    waiter = asyncio.ensure_future(client.tokenizer(MODEL))  # a request waiting for it
    await asyncio.sleep(0.05)
    await client.close()
    assert await _until(lambda: not client._fetcher._fetches, 2.0)  # callbacks delivered
    assert all(f.cancelled() for f in fetches)
    with pytest.raises(Unavailable, match="closing"):  # told to retry, not cancelled
        await waiter
    client._fetcher.prefetch([MODEL])  # a catalog that arrives while closing
    assert not client._fetcher._fetches
    await asyncio.sleep(0.7)  # the broker's late reply finds nothing to fill
    key = f"{MODEL.tokenizer_digest}:{MODEL.max_input_tokens}"
    assert client.tokenizers.get(key) is None


async def test_every_catalog_still_marks_its_models_as_served_now(broker) -> None:
    """models() keeps its merge between catalog changes; the "seen" book must still hear
    of every catalog (it forgets models unserved for 10 minutes)."""
    _, endpoint = broker
    async with MeshClient(endpoint, liveness=Liveness(interval_s=0.1)) as client:
        assert await _until(lambda: client.seen.find("m") is not None)
        first = client.seen.find("m").last_served
        assert await _until(lambda: client.seen.find("m").last_served > first + 0.15)

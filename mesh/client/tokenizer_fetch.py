"""A served model's tokenizer, from the brokers, once.

The catalog names each model's tokenizer by the digest of its tokenizer.json; the brokers
hold the file (workers send it in READY). A client fetches it the first time a request needs
it, or, asked to (the ingress), as soon as a catalog lists the model: its first request then
waits neither for the fetch nor for the tokenizer processes, which start when the pool first
gets a tokenizer. One fetch per (digest, length limit) is under way at a time, shared by
everyone waiting for it; the tokenizer is built off the event loop (a large tokenizer.json,
Qwen3's 11 MB, takes a while to parse). A prefetch that fails is tried again after
PREFETCH_RETRY_S, not on every catalog (one a heartbeat), and said once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Sequence

from mesh.client.connection import BrokerConnection
from mesh.client.tokenize import ModelTokenizer, TokenizerPool
from mesh.config import Liveness
from mesh.errors import MeshError, Unavailable
from proto_msgs import ModelInfo, TokenizerReply, TokenizerRequest

log = logging.getLogger("embedmesh.client")

PREFETCH_RETRY_S = 30.0


def tokenizer_key(model: ModelInfo) -> str:
    """Models that share a tokenizer and a length limit share its ModelTokenizer."""
    return f"{model.tokenizer_digest}:{model.max_input_tokens}"


class TokenizerFetcher:
    def __init__(
        self, brokers: Sequence[BrokerConnection], pool: TokenizerPool, liveness: Liveness
    ) -> None:
        self._brokers = brokers
        self._pool = pool
        self._liveness = liveness
        self._fetches: dict[str, asyncio.Future[ModelTokenizer]] = {}
        self._failed_at: dict[str, float] = {}  # prefetches that failed, by key: when
        self._closed = False

    async def get(self, model: ModelInfo) -> ModelTokenizer:
        """``model``'s tokenizer: at once when known, else after the (shared) fetch."""
        tok = self._pool.get(tokenizer_key(model))
        if tok is not None:
            return tok
        # Shielded: one waiter cancelled (its request gone) does not cancel the others'.
        fetch = self._fetch(model)
        try:
            return await asyncio.shield(fetch)
        except asyncio.CancelledError:
            if fetch.cancelled() and self._closed:  # the client closed under this caller
                raise Unavailable("the client is closing; retry") from None
            raise

    def prefetch(self, models: Iterable[ModelInfo]) -> None:
        """Start fetching the tokenizers of ``models`` not known nor under way (nor failed
        within PREFETCH_RETRY_S); nobody waits for them. Nothing once closed: a catalog
        that arrives while the client closes starts no fetch that would outlive it."""
        if self._closed:
            return
        now = time.monotonic()
        for model in models:
            key = tokenizer_key(model)
            if self._pool.get(key) is not None or key in self._fetches:
                continue
            if now - self._failed_at.get(key, -PREFETCH_RETRY_S) < PREFETCH_RETRY_S:
                continue
            fetch = self._fetch(model)
            fetch.add_done_callback(functools.partial(self._prefetched, key, model.name))

    def close(self) -> None:
        self._closed = True
        for fetch in list(self._fetches.values()):
            fetch.cancel()

    def _prefetched(self, key: str, name: str, fetch: asyncio.Future[ModelTokenizer]) -> None:
        if fetch.cancelled():
            return
        exc = fetch.exception()  # retrieved here: nobody else may wait for a prefetch
        if exc is None:
            self._failed_at.pop(key, None)
            return
        if key not in self._failed_at:
            log.warning(
                "could not prefetch the tokenizer of %r (%s); its first request asks again",
                name,
                exc,
            )
        self._failed_at[key] = time.monotonic()

    def _fetch(self, model: ModelInfo) -> asyncio.Future[ModelTokenizer]:
        """The one fetch of ``model``'s tokenizer under way, started if none is."""
        key = tokenizer_key(model)
        if self._closed:
            raise Unavailable("the client is closed")
        fetch = self._fetches.get(key)
        if fetch is None:
            fetch = asyncio.ensure_future(self._fetch_one(key, model))
            self._fetches[key] = fetch
            fetch.add_done_callback(lambda _: self._fetches.pop(key, None))
        return fetch

    async def _fetch_one(self, key: str, model: ModelInfo) -> ModelTokenizer:
        for broker in self._brokers:
            if not broker.alive:
                continue
            with contextlib.suppress(MeshError):
                reply = await broker.ask(
                    TokenizerRequest(cid=broker.next_cid(), digest=model.tokenizer_digest),
                    timeout_s=max(2.0, self._liveness.expiry_s),
                )
                if isinstance(reply, TokenizerReply) and reply.found:
                    tok = await asyncio.to_thread(ModelTokenizer, reply.content, model, key)
                    return self._pool.add_built(key, reply.content, tok)
        raise Unavailable(f"no broker could give the tokenizer of {model.name!r}")

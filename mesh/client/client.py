"""The asyncio client of the mesh: what the REST bridge, the benchmarks and batch jobs use.

``MeshClient`` connects to one or more broker frontends, learns the model catalog from them,
tokenizes with the catalog's tokenizer (fetched from the broker: no local model files), spreads
requests over live brokers by least outstanding tokens, and returns numpy arrays. Every call
ends with an ``EmbedResult`` or a ``mesh.errors.MeshError``.

    async with MeshClient(["tcp://127.0.0.1:5555"]) as client:
        result = await client.embed(["hello world"], model="all-MiniLM-L6-v2")
        result.embeddings  # np.ndarray [1, 384] float32
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

import numpy as np
import zmq
import zmq.asyncio

from mesh.client.connection import BrokerConnection, EmbedResult
from mesh.client.tokenize import ModelTokenizer, TokenizerPool
from mesh.config import DEFAULT_REQUEST_TIMEOUT_S, Liveness
from mesh.errors import (
    DeadlineExceeded,
    InvalidInput,
    MeshError,
    ModelNotFound,
    Unavailable,
)
from proto_msgs import (
    OUTPUT_KINDS,
    Lane,
    ModelInfo,
    OutputOptions,
    SubmitRequest,
    TokenizerReply,
    TokenizerRequest,
)

__all__ = ["EmbedResult", "MeshClient"]


class MeshClient:
    def __init__(
        self,
        brokers: Sequence[str] | str,
        *,
        liveness: Liveness | None = None,
        tokenizer_threads: int = 4,
        connect: Callable[[zmq.Socket, str], None] | None = None,
        default_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        endpoints = [brokers] if isinstance(brokers, str) else list(brokers)
        if not endpoints:
            raise ValueError("MeshClient needs at least one broker endpoint")
        self.liveness = liveness or Liveness()
        self.default_timeout_s = default_timeout_s
        self._ctx = zmq.asyncio.Context()
        self.brokers = [
            BrokerConnection(self._ctx, ep, self.liveness, connect=connect) for ep in endpoints
        ]
        self.tokenizers = TokenizerPool(tokenizer_threads)
        self._seen: dict[str, ModelInfo] = {}  # every model a broker ever listed
        self._tokenizer_fetches: dict[str, asyncio.Future[ModelTokenizer]] = {}

    async def __aenter__(self) -> MeshClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, wait_s: float = 0.0) -> None:
        """Open every broker link; optionally wait until one broker answers."""
        for broker in self.brokers:
            await broker.start()
        if wait_s > 0:
            await self.wait_ready(wait_s)

    async def wait_ready(self, timeout_s: float, model: str | None = None) -> None:
        """Wait until a broker is reachable (and serves ``model``, if given)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(b.alive and (model is None or _find(b.models, model)) for b in self.brokers):
                return
            await asyncio.sleep(0.05)
        raise Unavailable(f"no broker serving {model or 'anything'} within {timeout_s}s")

    async def close(self) -> None:
        for broker in self.brokers:
            await broker.close()
        self.tokenizers.close()
        self._ctx.destroy(linger=0)

    # ---- catalog ------------------------------------------------------------------------------

    def models(self) -> list[ModelInfo]:
        """The union of live brokers' catalogs (worker counts summed)."""
        merged: dict[str, ModelInfo] = {}
        for broker in self.brokers:
            if not broker.alive:
                continue
            for m in broker.models:
                if m.name in merged:
                    merged[m.name].workers += m.workers
                else:
                    merged[m.name] = ModelInfo(**{**m.__dict__, "aliases": list(m.aliases)})
        return list(merged.values())

    def resolve(self, name: str) -> ModelInfo:
        """The served model called ``name`` (or with that alias).

        Unavailable when no broker answers, or when the model was served before and has no
        worker now (retry later); ModelNotFound when no broker ever listed it.
        """
        if not any(b.alive for b in self.brokers):
            raise Unavailable("no broker is reachable; retry later")
        served = self.models()
        for m in served:
            self._seen[m.name] = m
        model = _find(served, name)
        if model is None:
            if _find(list(self._seen.values()), name) is not None:
                raise Unavailable(f"no worker serves model {name!r} right now; retry later")
            names = ", ".join(m.name for m in served) or "none right now"
            raise ModelNotFound(f"model {name!r} is not served (served: {names})")
        return model

    async def tokenizer(self, model: ModelInfo) -> ModelTokenizer:
        key = f"{model.tokenizer_digest}:{model.max_input_tokens}"
        tok = self.tokenizers.get(key)
        if tok is not None:
            return tok
        fetch = self._tokenizer_fetches.get(key)
        if fetch is None:
            fetch = asyncio.ensure_future(self._fetch_tokenizer(key, model))
            self._tokenizer_fetches[key] = fetch
            fetch.add_done_callback(lambda _: self._tokenizer_fetches.pop(key, None))
        return await asyncio.shield(fetch)

    async def _fetch_tokenizer(self, key: str, model: ModelInfo) -> ModelTokenizer:
        for broker in self.brokers:
            if not broker.alive:
                continue
            with contextlib.suppress(MeshError):
                reply = await broker.ask(
                    TokenizerRequest(cid=broker.next_cid(), digest=model.tokenizer_digest),
                    timeout_s=max(2.0, self.liveness.expiry_s),
                )
                if isinstance(reply, TokenizerReply) and reply.found:
                    return self.tokenizers.add(key, reply.content, model)
        raise Unavailable(f"no broker could give the tokenizer of {model.name!r}")

    # ---- embedding ----------------------------------------------------------------------------

    async def tokenize(
        self, texts: Sequence[str], model: str, *, truncate: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            raise InvalidInput("no input given")
        info = self.resolve(model)
        tok = await self.tokenizer(info)
        return await self.tokenizers.encode(tok, list(texts), truncate)

    async def embed(
        self,
        texts: Sequence[str],
        model: str,
        *,
        dims: int | None = None,
        normalize: bool = True,
        kind: str = "float32",
        lane: int = Lane.INTERACTIVE,
        timeout_s: float | None = None,
        truncate: bool = False,
    ) -> EmbedResult:
        """Embed ``texts`` with ``model``; rows follow the input order."""
        ids, offsets = await self.tokenize(texts, model, truncate=truncate)
        return await self.embed_tokens(
            ids,
            offsets,
            model,
            dims=dims,
            normalize=normalize,
            kind=kind,
            lane=lane,
            timeout_s=timeout_s,
        )

    async def embed_tokens(
        self,
        token_ids: np.ndarray,
        offsets: np.ndarray,
        model: str,
        *,
        dims: int | None = None,
        normalize: bool = True,
        kind: str = "float32",
        lane: int = Lane.INTERACTIVE,
        timeout_s: float | None = None,
    ) -> EmbedResult:
        """Embed already tokenized sequences (ids concatenated, offsets n+1)."""
        info = self.resolve(model)
        raw = np.asarray(token_ids)
        # Before the int32 cast, which would wrap an id of 2**32 + 5 into the vocabulary.
        if raw.size and (raw.min() < 0 or raw.max() >= info.vocab_size):
            raise InvalidInput(f"token ids must be in 0..{info.vocab_size - 1}")
        token_ids = np.ascontiguousarray(raw, dtype=np.int32)
        offsets = np.ascontiguousarray(offsets, dtype=np.int32)
        _check_tokens(token_ids, offsets, info)
        if kind not in OUTPUT_KINDS:
            raise InvalidInput(f"unknown output kind {kind!r}; use one of {sorted(OUTPUT_KINDS)}")
        if dims is not None and not 1 <= dims <= info.dims:
            raise InvalidInput(f"dimensions must be between 1 and {info.dims} for {info.name}")
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        broker = self._pick(info.name)
        cid = broker.next_cid()
        request = SubmitRequest(
            cid=cid,
            model=info.name,
            lane=lane,
            timeout_ms=max(1, int(timeout_s * 1000)),
            output=OutputOptions(dims=dims, normalize=normalize, kind=kind),
            token_ids=token_ids,
            offsets=offsets,
        )
        pending = broker.submit(request, tokens=len(token_ids))
        try:
            # The broker enforces the deadline; this local one (a liveness window later) is
            # the safety net for a broker that dies silently mid-request.
            return await asyncio.wait_for(
                asyncio.shield(pending.future), timeout_s + self.liveness.expiry_s
            )
        except TimeoutError as exc:
            raise DeadlineExceeded(f"no result within {timeout_s}s") from exc
        finally:
            if not pending.future.done():
                broker.cancel(cid)  # caller gave up (timeout or task cancelled)
                pending.future.cancel()

    def _pick(self, model: str) -> BrokerConnection:
        live = [b for b in self.brokers if b.alive and _find(b.models, model)]
        if not live:
            raise Unavailable(f"no live broker has a worker for {model!r}")
        return min(live, key=lambda b: b.outstanding_tokens)


def _find(models: list[ModelInfo], name: str) -> ModelInfo | None:
    for m in models:
        if m.name == name or name in m.aliases:
            return m
    return None


def _check_tokens(ids: np.ndarray, offsets: np.ndarray, info: ModelInfo) -> None:
    if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 2:
        raise InvalidInput("token input must hold at least one sequence")
    if offsets[0] != 0 or offsets[-1] != len(ids):
        raise InvalidInput("offsets must start at 0 and end at the number of tokens")
    lengths = np.diff(offsets)
    if lengths.min() < 1:
        raise InvalidInput(f"input[{int(np.argmin(lengths))}] is empty")
    if lengths.max() > info.max_input_tokens:
        i = int(np.argmax(lengths))
        raise InvalidInput(
            f"input[{i}] has {int(lengths[i])} tokens, over the model's limit of "
            f"{info.max_input_tokens}"
        )
    if len(ids) and (ids.min() < 0 or ids.max() >= info.vocab_size):
        raise InvalidInput(f"token ids must be in 0..{info.vocab_size - 1}")

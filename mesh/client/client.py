"""The asyncio client of the mesh: what the REST bridge, the benchmarks and batch jobs use.

``MeshClient`` connects to one or more broker frontends, learns the model catalog from them,
tokenizes with the catalog's tokenizer (fetched from the broker: no local model files), spreads
requests over live brokers by least outstanding tokens, and returns numpy arrays. Every call
ends with an ``EmbedResult`` or a ``mesh.errors.MeshError``.

One front door: a request is resolved and validated once (``prepare_texts`` /
``prepare_tokens``) into a ``ValidRequest`` that ``submit`` sends as it is. ``embed`` and
``embed_tokens`` are the two composed; the REST bridge calls the halves to time them apart.

    async with MeshClient(["tcp://127.0.0.1:5555"]) as client:
        result = await client.embed(["hello world"], model="all-MiniLM-L6-v2")
        result.embeddings  # np.ndarray [1, 384] float32
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
import zmq
import zmq.asyncio

from mesh.client.admission import check_backlog, may_refuse, text_floor
from mesh.client.connection import BrokerConnection, EmbedResult
from mesh.client.models import ModelBook
from mesh.client.pairs import ScoreInput, encode_pooled
from mesh.client.request import (
    CHARS_PER_TOKEN_GUESS,
    ValidRequest,
    check_task,
    guess_lane,
    lane_for,
    output_options,
    prompt_skip,
    prompt_text,
    valid_tokenized,
    valid_tokens,
)
from mesh.client.scores import activate
from mesh.client.tokenize import ModelTokenizer, TokenizerPool
from mesh.client.tokenizer_fetch import TokenizerFetcher
from mesh.config import DEFAULT_REQUEST_TIMEOUT_S, Liveness
from mesh.errors import DeadlineExceeded, InvalidInput, ModelNotFound, Unavailable
from proto_msgs import (
    BrokerStats,
    Lane,
    ModelInfo,
    OutputOptions,
    SubmitRequest,
)
from proto_msgs.checks import find_model

__all__ = ["EmbedResult", "MeshClient", "ValidRequest"]


class MeshClient:
    def __init__(
        self,
        brokers: Sequence[str] | str,
        *,
        liveness: Liveness | None = None,
        tokenizer_threads: int = 4,
        tokenize_processes: int = 0,
        connect: Callable[[zmq.Socket, str], None] | None = None,
        default_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        prefetch_tokenizers: bool = False,
    ) -> None:
        """``prefetch_tokenizers``: fetch each served model's tokenizer as soon as a catalog
        lists it (starting the tokenizer processes, if any), not on its first request, which
        then paid the fetch and the children's start-up (about a second of CPU each, on the
        cores serving it): for a client that tokenizes texts, as the ingress."""
        endpoints = [brokers] if isinstance(brokers, str) else list(brokers)
        if not endpoints:
            raise ValueError("MeshClient needs at least one broker endpoint")
        self.liveness = liveness or Liveness()
        self.default_timeout_s = default_timeout_s
        self._ctx = zmq.asyncio.Context()
        self.seen = ModelBook()  # every model a broker listed: the one owner of "seen"
        # Each catalog reply (every heartbeat) refreshes "seen", so a quiet client still knows
        # when a model was last served, not only when it last asked.
        self._prefetch = prefetch_tokenizers
        # models(): the brokers' catalogs (None: not alive) it last merged, and the result.
        self._merged: tuple[list[list[ModelInfo] | None], list[ModelInfo]] = ([], [])
        self.brokers = [
            BrokerConnection(
                self._ctx, ep, self.liveness, connect=connect, on_catalog=self._on_catalog
            )
            for ep in endpoints
        ]
        # Bulk tokenization in child processes (mesh.client.tokenize_procs): for a process the
        # client owns, as the ingress; off by default, since spawning children re-imports the
        # caller's main module (an unguarded script would run again in each).
        self.tokenizers = TokenizerPool(tokenizer_threads, processes=tokenize_processes)
        self._fetcher = TokenizerFetcher(self.brokers, self.tokenizers, self.liveness)

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
            if any(
                b.alive and (model is None or find_model(b.models, model)) for b in self.brokers
            ):
                return
            await asyncio.sleep(0.05)
        raise Unavailable(f"no broker serving {model or 'anything'} within {timeout_s}s")

    async def close(self) -> None:
        self._fetcher.close()
        for broker in self.brokers:
            await broker.close()
        self.tokenizers.close()
        self._ctx.destroy(linger=0)

    # ---- catalog ------------------------------------------------------------------------------

    def _on_catalog(self, _: object) -> None:
        served = self.models()
        if self._prefetch:
            self._fetcher.prefetch(served)

    def models(self) -> list[ModelInfo]:
        """The union of live brokers' catalogs (worker counts summed); remembered as seen.
        The merge is kept until a broker's catalog or liveness changes (every request
        resolves its model here; merging anew cost 15 µs a request with one model, more with
        each model served): the ModelInfo objects are shared, read them only."""
        current = [b.models if b.alive else None for b in self.brokers]
        merged_from, served = self._merged
        if len(merged_from) == len(current) and all(
            a is b for a, b in zip(merged_from, current, strict=True)
        ):
            return list(served)
        served = self._merge()
        self._merged = (current, served)
        return list(served)

    def _merge(self) -> list[ModelInfo]:
        merged: dict[str, ModelInfo] = {}
        for broker in self.brokers:
            if not broker.alive:
                continue
            for m in broker.models:
                if m.name in merged:
                    merged[m.name].workers += m.workers
                else:
                    merged[m.name] = ModelInfo(**{**m.__dict__, "aliases": list(m.aliases)})
        served = list(merged.values())
        self.seen.note(served)
        return served

    def resolve(self, name: str) -> ModelInfo:
        """The served model called ``name`` (or with that alias).

        Unavailable when no broker answers, or when the model was served before and has no
        worker now (retry later); ModelNotFound when no broker listed it (or it was forgotten).
        """
        if not any(b.alive for b in self.brokers):
            raise Unavailable("no broker is reachable; retry later")
        served = self.models()
        model = find_model(served, name)
        if model is None:
            if self.seen.find(name) is not None:
                raise Unavailable(f"no worker serves model {name!r} right now; retry later")
            if any(b.alive and not b.catalog_known for b in self.brokers):
                # A broker just (re)connected and its catalog is on its way: unknown yet is
                # not "not served" (a freshly restarted ingress answered 404s here).
                raise Unavailable("the model catalog is still arriving from a broker; retry")
            names = ", ".join(m.name for m in served) or "none right now"
            raise ModelNotFound(f"model {name!r} is not served (served: {names})")
        return model

    async def tokenizer(self, model: ModelInfo) -> ModelTokenizer:
        """``model``'s tokenizer (fetched from a broker the first time)."""
        return await self._fetcher.get(model)

    # ---- the front door: resolve and validate once ----------------------------------------------

    async def prepare_texts(
        self,
        texts: Sequence[str],
        model: str,
        *,
        dims: int | None = None,
        normalize: bool = True,
        kind: str = "float32",
        lane: int | None = None,
        truncate: bool = False,
        prompt_name: str | None = None,
        top_k: int | None = None,
        threshold: float = 0.0,
        timeout_s: float | None = None,
    ) -> ValidRequest:
        """Resolve ``model``, check the options, tokenize (live work first; all but the
        shortest queries on the tokenizer threads): the request ready to submit. ``lane``
        None: chosen by size. ``prompt_name``: one of the model's sentence-transformers
        prompts, put before every text (None: the model's default prompt, if it has one).
        ``kind="sparse"`` for a sparse model's weights, ``top_k`` and ``threshold`` bounding
        them (``request.output_options``). ``timeout_s``: the one it will be submitted with
        (None: the client's default), against which the early 429 measures the backlog."""
        texts = list(texts)
        if not texts:
            raise InvalidInput("no input given", param="input")
        info = self.resolve(model)
        check_task(info, "sparse" if kind == "sparse" else "embed")
        output = output_options(info, dims, normalize, kind, top_k, threshold, len(texts))
        prompt = prompt_text(info, prompt_name)
        if prompt:
            texts = [prompt + t for t in texts]
        self._check_text_backlog(info, texts, lane, timeout_s)
        tok = await self.tokenizer(info)
        ids, lengths = await self.tokenizers.encode(tok, texts, truncate, guess_lane(texts, lane))
        if prompt and not info.include_prompt:
            output = prompt_skip(info, output, tok.prompt_length(prompt), lengths)
        return valid_tokenized(info, ids, lengths, output, lane)

    def prepare_tokens(
        self,
        token_ids: np.ndarray,
        offsets: np.ndarray,
        model: str,
        *,
        dims: int | None = None,
        normalize: bool = True,
        kind: str = "float32",
        lane: int | None = None,
        truncate: bool = False,
        top_k: int | None = None,
        threshold: float = 0.0,
        timeout_s: float | None = None,
    ) -> ValidRequest:
        """Resolve ``model`` and check the given ids (ids concatenated, offsets n+1) once
        (``kind``, ``top_k``, ``threshold``, ``timeout_s`` as in :meth:`prepare_texts`)."""
        info = self.resolve(model)
        check_task(info, "sparse" if kind == "sparse" else "embed")
        n = len(offsets) - 1
        output = output_options(info, dims, normalize, kind, top_k, threshold, n)
        valid = valid_tokens(info, token_ids, offsets, output, lane, truncate)
        self._check_backlog(info, valid.lane, valid.tokens, timeout_s)
        return valid

    async def prepare_scores(
        self,
        inputs: Sequence[ScoreInput],
        model: str,
        *,
        lane: int | None = None,
        truncate: bool = False,
        left: bool = False,
        timeout_s: float | None = None,
    ) -> ValidRequest:
        """Resolve a cross-encoder and tokenize what it scores once: single texts and
        (query, passage) pairs, as its tokenizer pairs them (``mesh.client.pairs``), cut at
        its limit when ``truncate`` (from the left when ``left``), else refused when over.
        The submitted request answers raw logits ``[n, labels]`` (``scores.activate`` makes
        them the model's scores); an embedding model is InvalidInput."""
        inputs = list(inputs)
        if not inputs:
            raise InvalidInput("no input given", param="input")
        info = self.resolve(model)
        check_task(info, "score")
        # Sizes only, never the pairs joined: /rerank repeats one query for every text, and
        # joining a 1 MB query to 2048 texts took 5 s of the loop and 2 GB.
        self._check_text_backlog(info, inputs, lane, timeout_s)
        tok = await self.tokenizer(info)
        chars = sum(min(_chars(x), 2 * tok.cut_chars) for x in inputs)
        priority = lane_for(chars // CHARS_PER_TOKEN_GUESS, lane)
        ids, lengths, starts = await encode_pooled(
            self.tokenizers, tok, inputs, truncate, left, priority
        )
        logits = OutputOptions(dims=None, normalize=False, kind="float32")
        valid = valid_tokenized(info, ids, lengths, logits, lane)
        return dataclasses.replace(valid, segment_b_start=starts if starts.any() else None)

    async def tokenize(
        self, texts: Sequence[str], model: str, *, truncate: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """int32 ids (concatenated) and offsets (n+1) of ``texts``, for callers that keep
        tokens to send later with ``embed_tokens``."""
        texts = list(texts)
        if not texts:
            raise InvalidInput("no input given", param="input")
        info = self.resolve(model)
        tok = await self.tokenizer(info)
        # No admission check: tokenizing queues nothing on the mesh.
        ids, lengths = await self.tokenizers.encode(tok, texts, truncate, guess_lane(texts, None))
        valid = valid_tokenized(
            info, ids, lengths, output_options(info, None, True, "float32"), None
        )
        return valid.token_ids, valid.offsets

    async def submit(self, request: ValidRequest, timeout_s: float | None = None) -> EmbedResult:
        """Send a validated request; no model lookup or check happens again here."""
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        broker = self._pick(request.model.name)
        cid = broker.next_cid()
        submit = SubmitRequest(
            cid=cid,
            model=request.model.name,
            lane=int(request.lane),
            timeout_ms=max(1, int(timeout_s * 1000)),
            output=request.output,
            token_ids=request.token_ids,
            offsets=request.offsets,
            segment_b_start=request.segment_b_start,
            spans=request.spans,
            span_offsets=request.span_offsets,
        )
        future = broker.submit(submit, tokens=request.tokens).future
        # The broker enforces the deadline; this local one (a liveness window later) is the
        # safety net for a broker that dies silently mid-request. A timer on the future itself,
        # not wait_for(shield(...)), which adds an outer future, a waiter and their callbacks
        # (and a wake-up more) to every request.
        deadline = asyncio.get_running_loop().call_later(
            timeout_s + self.liveness.expiry_s, _expire, future, timeout_s
        )
        try:
            return await future  # the caller's cancellation cancels the future too
        except ModelNotFound as exc:
            # This broker's catalog listed the model when it was picked: it has changed since
            # (the broker restarted before its workers registered again, or forgot the model
            # in the meantime). For the caller that is "not served right now", not "never
            # served": a restarted broker answered 404 to a request resolved a moment before.
            raise Unavailable(
                f"the broker no longer serves {request.model.name!r} ({exc}); retry"
            ) from exc
        finally:
            deadline.cancel()
            # A request still in the link's table was given up here (deadline or caller
            # cancelled): the broker drops it. An answered one has left the table: a no-op.
            broker.cancel(cid)

    # ---- embedding: the front door and submit, composed -------------------------------------------

    async def embed(
        self,
        texts: Sequence[str],
        model: str,
        *,
        dims: int | None = None,
        normalize: bool = True,
        kind: str = "float32",
        lane: int | None = Lane.INTERACTIVE,
        timeout_s: float | None = None,
        truncate: bool = False,
        prompt_name: str | None = None,
    ) -> EmbedResult:
        """Embed ``texts`` with ``model``; rows follow the input order. ``lane`` None: by
        size (more than ``INTERACTIVE_MAX_TOKENS`` tokens go to the batch lane).
        ``prompt_name``: as in :meth:`prepare_texts`."""
        request = await self.prepare_texts(
            texts, model, dims=dims, normalize=normalize, kind=kind, lane=lane, truncate=truncate,
            prompt_name=prompt_name, timeout_s=timeout_s,
        )  # fmt: skip
        return await self.submit(request, timeout_s)

    async def embed_tokens(
        self,
        token_ids: np.ndarray,
        offsets: np.ndarray,
        model: str,
        *,
        dims: int | None = None,
        normalize: bool = True,
        kind: str = "float32",
        lane: int | None = Lane.INTERACTIVE,
        timeout_s: float | None = None,
        truncate: bool = False,
    ) -> EmbedResult:
        """Embed already tokenized sequences (ids concatenated, offsets n+1)."""
        request = self.prepare_tokens(
            token_ids, offsets, model, dims=dims, normalize=normalize, kind=kind, lane=lane,
            truncate=truncate, timeout_s=timeout_s,
        )  # fmt: skip
        return await self.submit(request, timeout_s)

    async def score(
        self,
        inputs: Sequence[ScoreInput],
        model: str,
        *,
        raw: bool = False,
        lane: int | None = Lane.INTERACTIVE,
        timeout_s: float | None = None,
        truncate: bool = False,
    ) -> np.ndarray:
        """Score texts and (query, passage) pairs with a cross-encoder: ``float32 [n, labels]``
        in input order, through the model's activation (``raw``: the logits)."""
        request = await self.prepare_scores(
            inputs, model, lane=lane, truncate=truncate, timeout_s=timeout_s
        )
        logits = (await self.submit(request, timeout_s)).embeddings
        return logits if raw else activate(logits, request.model.activation)

    def _check_text_backlog(
        self,
        model: ModelInfo,
        inputs: Sequence[str | tuple[str, str]],
        lane: int | None,
        timeout_s: float | None,
    ) -> None:
        """:meth:`_check_backlog` of a text request by its floor (``text_floor``), counted only
        when the request could be refused at all: each input reaches a broker as at most the
        model's limit in tokens (cut, or refused when over), and when even that many would
        end in time nothing is refused. Under a bulk load that keeps up, as on a GPU, the
        count is skipped."""
        if lane is not None:
            lane_for(0, lane)  # a bad lane is said now, counted or not, before any fetch
        most = len(inputs) * model.max_input_tokens
        serving, timeout = self._backlogs(model, timeout_s)
        if model.max_input_tokens > 0 and not may_refuse(serving, model.name, most, timeout):
            return
        floor_lane, floor = text_floor(inputs, lane, model.max_input_tokens)
        check_backlog(serving, model.name, floor_lane, floor, timeout)

    def _check_backlog(
        self, model: ModelInfo, lane: Lane, tokens: int, timeout_s: float | None = None
    ) -> None:
        """429 before any work when at every broker the request would end after its timeout
        (None: the client's default; see :mod:`mesh.client.admission`)."""
        serving, timeout = self._backlogs(model, timeout_s)
        check_backlog(serving, model.name, lane, tokens, timeout)

    def _backlogs(
        self, model: ModelInfo, timeout_s: float | None
    ) -> tuple[list[BrokerStats | None], float]:
        """The stats of the live brokers serving ``model``, and the timeout in force."""
        serving = [b.stats for b in self.brokers if b.alive and find_model(b.models, model.name)]
        return serving, self.default_timeout_s if timeout_s is None else timeout_s

    def _pick(self, model: str) -> BrokerConnection:
        live = [b for b in self.brokers if b.alive and find_model(b.models, model)]
        if not live:
            raise Unavailable(f"no live broker has a worker for {model!r}")
        return min(live, key=lambda b: b.outstanding_tokens)


def _chars(item: ScoreInput) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


def _expire(future: asyncio.Future[EmbedResult], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(DeadlineExceeded(f"no result within {timeout_s}s"))

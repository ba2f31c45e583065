"""Tokenization off the event loop, with the catalog's tokenizer, live work first.

Three rules keep a huge or bulk input from costing more than it is allowed to:

- **Cut before tokenizing.** No model reads more than ``max_input_tokens`` tokens, and no token
  spans more than the vocabulary's longest entry in characters, so a text is first cut to
  ``(max_input_tokens + 1) × longest entry`` characters. The cut piece is tokenized with
  truncation at the limit; the result is the full text's (tokenized then truncated) exactly
  when the piece overflowed and the kept tokens end at least one whole word (the tokenizer's
  pre-tokenized words) before the piece's last word, which the cut may have split. Otherwise
  (long runs of whitespace or of characters the tokenizer drops, one giant word) the bound
  grows fourfold and the piece is tokenized again: at most a few passes, and all of them
  together cost less than twice tokenizing the whole text once.
- **Never twice.** An over-long input without truncation is refused from the cut piece ("more
  than N tokens"): counting its tokens would mean tokenizing all of it.
- **Release the GIL.** ``Tokenizer.encode`` (one text) holds the GIL for the whole encoding
  (tokenizers 0.23: no ``py.detach`` around it; measured: a 3.7 s stall of every other thread
  for a 2.6 MB text); ``encode_batch`` releases it. So every call is ``encode_batch``, ids are
  gathered by C-level iteration, and jobs run on a ``PriorityExecutor``: INTERACTIVE before
  BATCH, bulk requests split into chunks so that a query waits for one chunk at most. Only a
  short interactive request (``INLINE_MAX_CHARS``) is tokenized on the caller's thread: it
  costs less than the hop to a pool thread and back.

Special tokens ([CLS], [SEP], EOS) are added by the tokenizer's post-processor after the
truncation, as sentence-transformers does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from mesh.client.ascii_shortcut import AsciiShortcut
from mesh.client.executor import PriorityExecutor
from mesh.client.tokenize_procs import BrokenProcessPool, BulkProcesses
from mesh.client.word_memo import WordMemo
from mesh.config import BULK_NICE, BULK_SCHED
from mesh.env_knobs import switch_from_env
from mesh.errors import InvalidInput
from proto_msgs import Lane, ModelInfo
from proto_msgs.checks import over_limit_message

log = logging.getLogger("embedmesh.client")

T = TypeVar("T")

# A few vocabularies hold very long entries (runs of '=' or of spaces in byte-level BPE); the
# bound uses at most this many characters per token, and the retry covers texts made of them.
MAX_CHARS_PER_TOKEN = 32
GROWTH = 4  # the bound's growth when a cut piece proved too short; 2..8 is reasonable
# A tokenizer job: at most this many texts or (cut) characters, so that a query queued behind
# bulk work waits for about a millisecond's worth of tokenizing per thread.
CHUNK_TEXTS = 32
CHUNK_CHARS = 32_768
# A bulk job for a tokenizer process: no query waits behind it (queries stay in the parent), so
# only the cost of a hop (pickles both ways, wake-ups of three parent threads) and spreading one
# large request over the processes count. 4..16 times the thread job is reasonable.
PROCESS_CHUNK_TEXTS = 128
PROCESS_CHUNK_CHARS = 131_072
# An interactive request of at most this many characters is tokenized on the caller's thread
# (the event loop): ~0.1 ms of work, less than the 0.2-0.4 ms a hop to a pool thread and back
# costs, and that hop is most of an idle query's ingress time. 256..4096 is reasonable.
INLINE_MAX_CHARS = 1024


class ModelTokenizer:
    """A tokenizer set up for one model: no padding, truncation at its input limit."""

    def __init__(self, tokenizer_json: bytes, model: ModelInfo, digest: str | None = None) -> None:
        self.model = model
        self.digest = digest  # the catalog's key for it: what tokenizer processes load it by
        text = tokenizer_json.decode("utf-8")
        spec = json.loads(text)  # read by the shortcut and the memo: parsed once
        self._tok = Tokenizer.from_str(text)
        # Shipped tokenizer.json files often pad/cut to a fixed length (all-MiniLM-L6-v2's
        # pads to 128): packed batches want neither.
        self._tok.no_padding()
        self._tok.enable_truncation(model.max_input_tokens)
        # ASCII texts normalized in Python skip the tokenizer's normalizer: a third of
        # WordPiece's time (mesh/client/ascii_shortcut.py).
        self._shortcut = AsciiShortcut(spec, self._tok)
        longest = max(map(len, self._tok.get_vocab(with_added_tokens=True)), default=1)
        self.cut_chars = (model.max_input_tokens + 1) * min(longest, MAX_CHARS_PER_TOKEN)
        # And a BERT-style WordPiece tokenizes those texts word by word from a memo of each
        # word's ids: a third of the time again (mesh/client/word_memo.py).
        # EMBEDMESH_WORD_MEMO=0 turns it off (to compare, or should a tokenizer ever slip past
        # its self-check).
        self._memo = WordMemo(
            spec,
            self._tok,
            self._shortcut,
            model.max_input_tokens,
            self.cut_chars,
            enabled=switch_from_env("EMBEDMESH_WORD_MEMO") is not False,
        )
        self._prompt_lengths: dict[str, int] = {}

    def prompt_length(self, prompt: str) -> int:
        """How many leading tokens of a text with ``prompt`` before it are the prompt's, as
        sentence-transformers counts them to leave them out of the pooling: the prompt
        tokenized alone, less its last token when that is a special one (the [SEP] or EOS
        that ends the prompt alone, not the text it is put before)."""
        length = self._prompt_lengths.get(prompt)
        if length is None:
            ids = self._tok.encode_batch([prompt])[0].ids
            decoder = self._tok.get_added_tokens_decoder()
            special = bool(ids) and decoder.get(ids[-1]) is not None and decoder[ids[-1]].special
            length = self._prompt_lengths[prompt] = len(ids) - special
        return length

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer itself (no padding, truncation at the limit), for callers that need
        more than ids (TEI's /tokenize offsets, /decode). Threads share it: copy it (e.g.
        ``Tokenizer.from_str(tok.to_str())``) before changing its settings."""
        return self._tok

    def encode(
        self, texts: list[str], truncate: bool, first: int = 0, memo: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32, concatenated) and lengths (int32) of ``texts``, which are inputs
        ``first``, ``first + 1``, ... of their request (for error messages). ``memo``: the
        word memo may serve them; it holds the GIL while it works, where the tokenizer's
        batch calls release it, so a thread sharing its process with an event loop passes
        False (:meth:`encode_in_thread`)."""
        id_lists, over = self._ids(texts, memo)
        if not truncate and any(over):
            i = first + over.index(True)  # the first offending input, as the message says
            raise InvalidInput(over_limit_message(i, self.model), param="input")
        lengths = np.fromiter(map(len, id_lists), dtype=np.int32, count=len(id_lists))
        if lengths.min(initial=1) < 1:
            i = first + int(np.argmin(lengths))
            raise InvalidInput(f"input[{i}] tokenizes to nothing", param="input")
        # chain.from_iterable iterates in C: no Python frame per token while holding the GIL.
        ids = np.fromiter(
            itertools.chain.from_iterable(id_lists), dtype=np.int32, count=int(lengths.sum())
        )
        return ids, lengths

    def encode_in_thread(
        self, texts: list[str], truncate: bool, first: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode` by the tokenizer's GIL-releasing calls alone: for a pool thread
        beside the event loop, which would otherwise wait for the GIL the memo holds."""
        return self.encode(texts, truncate, first, memo=False)

    def _ids(self, texts: list[str], use_memo: bool) -> tuple[list[list[int]], list[bool]]:
        """Each text's ids (truncated at the limit) and whether it overflowed: from the word
        memo where it applies (and ``use_memo``), the rest from the tokenizer's encodings."""
        memo = self._memo
        if not (use_memo and memo.on):
            encodings = self.encode_cut(texts)
            return [enc.ids for enc in encodings], [bool(enc.overflowing) for enc in encodings]
        id_lists: list[list[int]] = []
        over: list[bool] = []
        rest: list[int] = []
        for i, text in enumerate(texts):
            got = memo.ids(text)
            if got is None:
                rest.append(i)
                got = ([], False)
            id_lists.append(got[0])
            over.append(got[1])
        if rest:
            for i, enc in zip(rest, self.encode_cut([texts[i] for i in rest]), strict=True):
                id_lists[i], over[i] = enc.ids, bool(enc.overflowing)
        return id_lists, over

    def encode_cut(self, texts: list[str]) -> list[Encoding]:
        """Each text tokenized and truncated at the limit, tokenizing a bounded prefix."""
        out: list[Encoding | None] = [None] * len(texts)
        bounds = [self.cut_chars] * len(texts)
        todo = list(range(len(texts)))
        while todo:
            whole = [i for i in todo if len(texts[i]) <= bounds[i]]
            if whole:
                # Uncut texts need no word ids (only _settled reads them): encode_batch_fast
                # skips the offsets and word ids, 15-25 % of a bulk request's tokenizing
                # (tokenizers 0.23, MiniLM's WordPiece; same ids, type ids, overflow).
                encodings = self._batch([texts[i] for i in whole], fast=True)
                for i, enc in zip(whole, encodings, strict=True):
                    out[i] = enc
                if len(whole) == len(todo):
                    break
                todo = [i for i in todo if len(texts[i]) > bounds[i]]
            pieces = [texts[i][: bounds[i]] for i in todo]
            again = []
            longest = self._shortcut.longest_added
            for i, enc in zip(todo, self._batch(pieces, fast=False), strict=True):
                if _settled(enc, longest):
                    out[i] = enc
                else:
                    bounds[i] *= GROWTH
                    again.append(i)
            todo = again
        return out  # type: ignore[return-value]

    def _batch(self, texts: list[str], fast: bool) -> list[Encoding]:
        """``texts`` encoded (``fast``: without offsets and word ids), those the ASCII
        shortcut takes by the tokenizer without a normalizer, the rest by the full one."""

        def run(tok: Tokenizer, batch: list[str]) -> list[Encoding]:
            return tok.encode_batch_fast(batch) if fast else tok.encode_batch(batch)

        indices, normalized = self._shortcut.split(texts)
        if not indices:
            return run(self._tok, texts)
        plain = self._shortcut.tokenizer
        assert plain is not None  # split() gives indices only when there is one
        short = run(plain, normalized)
        if len(indices) == len(texts):
            return short
        out: list[Encoding | None] = [None] * len(texts)
        for i, enc in zip(indices, short, strict=True):
            out[i] = enc
        rest = [i for i, enc in enumerate(out) if enc is None]
        for i, enc in zip(rest, run(self._tok, [texts[i] for i in rest]), strict=True):
            out[i] = enc
        return out  # type: ignore[return-value]


def _last_word(word_ids: list[int | None]) -> int:
    return next((w for w in reversed(word_ids) if w is not None), -1)


def _settled(enc: Encoding, longest_added: int = 0) -> bool:
    """Whether a cut piece's truncated encoding is the full text's: it overflowed (so the text
    holds more tokens than the limit) and its kept tokens end before the piece's last two
    words (the last may be split by the cut; the one before it guards against a pre-tokenizer
    whose split looks one character ahead) and before the piece's last ``longest_added``
    characters (an added token's text running past the cut, matched in the whole text, may
    start there and span several words: "</e1>" is four)."""
    rest = enc.overflowing
    if not rest:
        return False
    if _last_word(enc.word_ids) >= _last_word(rest[-1].word_ids) - 1:
        return False
    if not longest_added:
        return True
    # In the offsets' own coordinates (the normalized text's, for the ASCII shortcut's
    # encodings): where the kept tokens end against where the piece's last token ends.
    return _last_end(enc) <= _last_end(rest[-1]) - longest_added


def _last_end(enc: Encoding) -> int:
    ends = (
        end for word, (_, end) in zip(enc.word_ids, enc.offsets, strict=True) if word is not None
    )
    return max(ends, default=0)


def chunks(
    texts: list[str], cut_chars: int, most_texts: int = CHUNK_TEXTS, most_chars: int = CHUNK_CHARS
) -> Iterator[tuple[int, int]]:
    """(start, end) spans of ``texts``: at most ``most_texts`` texts or ``most_chars``
    characters (each text counted up to its cut) per span, at least one text."""
    return chunk_sizes([min(len(text), cut_chars) for text in texts], most_texts, most_chars)


def chunk_sizes(
    sizes: list[int], most_texts: int = CHUNK_TEXTS, most_chars: int = CHUNK_CHARS
) -> Iterator[tuple[int, int]]:
    """:func:`chunks` over inputs given by their sizes in characters (already cut)."""
    start, chars = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= most_texts or chars + size > most_chars):
            yield start, i
            start, chars = i, 0
        chars += size
    if start < len(sizes):
        yield start, len(sizes)


def _chars_within(texts: list[str], limit: int) -> bool:
    total = 0
    for text in texts:  # stops at once on a huge request instead of summing it all
        total += len(text)
        if total > limit:
            return False
    return True


def bulk_nice_from_env() -> int:
    """``EMBEDMESH_BULK_NICE``: how much lower bulk tokenization runs than live work (0 = the
    same). With it set, tokenizers' own thread pool is turned off in this process
    (``TOKENIZERS_PARALLELISM=false``): its threads would run bulk work at the priority of
    whoever started them, and the executor's threads already spread the work over the cores."""
    try:
        nice = max(0, int(os.environ.get("EMBEDMESH_BULK_NICE", str(BULK_NICE))))
    except ValueError:
        nice = BULK_NICE
    if nice:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return nice


def bulk_sched_idle_from_env() -> bool:
    """``EMBEDMESH_BULK_SCHED``: ``idle`` runs the bulk tokenizer processes under SCHED_IDLE,
    ``nice`` at the bulk nice alone (``mesh.config.BULK_SCHED`` says why idle is the default).
    Any other value keeps the default, with a warning naming the two it may be (like the other
    overrides, a bad value does not stop the ingress)."""
    value = os.environ.get("EMBEDMESH_BULK_SCHED", BULK_SCHED).strip().lower() or BULK_SCHED
    if value not in ("idle", "nice"):
        log.warning("EMBEDMESH_BULK_SCHED is 'idle' or 'nice', not %r: using %r", value, BULK_SCHED)
        value = BULK_SCHED
    return value == "idle"


class TokenizerPool:
    """Tokenizers by digest, and the threads that run them (live work first); with
    ``processes`` > 0, bulk (BATCH-lane) chunks run in that many child processes instead
    (:mod:`mesh.client.tokenize_procs`: off the event loop's GIL)."""

    def __init__(
        self,
        threads: int = 4,
        bulk_nice: int | None = None,
        processes: int = 0,
        sched_idle: bool | None = None,
    ) -> None:
        if bulk_nice is None:
            bulk_nice = bulk_nice_from_env()
        if sched_idle is None:
            sched_idle = bulk_sched_idle_from_env() if processes > 0 else False
        self._pool = PriorityExecutor(threads, "tokenize", bulk_nice)
        self._procs = BulkProcesses(processes, bulk_nice, sched_idle) if processes > 0 else None
        self._by_digest: dict[str, ModelTokenizer] = {}

    def get(self, digest: str) -> ModelTokenizer | None:
        return self._by_digest.get(digest)

    def add(self, digest: str, tokenizer_json: bytes, model: ModelInfo) -> ModelTokenizer:
        return self.add_built(digest, tokenizer_json, ModelTokenizer(tokenizer_json, model, digest))

    def add_built(self, digest: str, tokenizer_json: bytes, tok: ModelTokenizer) -> ModelTokenizer:
        """:meth:`add` of a tokenizer built already (off the event loop: a large one takes a
        while to parse)."""
        if self._procs is not None:
            self._procs.add(digest, tokenizer_json)
        self._by_digest[digest] = tok
        return tok

    async def encode(
        self,
        tok: ModelTokenizer,
        texts: list[str],
        truncate: bool,
        priority: Lane = Lane.INTERACTIVE,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids and lengths of ``texts``, tokenized in chunks at ``priority``."""
        if priority == Lane.INTERACTIVE and _chars_within(texts, INLINE_MAX_CHARS):
            return tok.encode(texts, truncate)
        in_child = priority == Lane.BATCH and self._procs is not None and tok.digest is not None
        sizes = (PROCESS_CHUNK_TEXTS, PROCESS_CHUNK_CHARS) if in_child else ()
        jobs = [
            asyncio.ensure_future(self._in_child(tok, texts[a:b], truncate, a))
            if in_child
            else asyncio.wrap_future(
                self._pool.submit(int(priority), tok.encode_in_thread, texts[a:b], truncate, a)
            )
            for a, b in chunks(texts, tok.cut_chars, *sizes)
        ]
        try:
            parts = await asyncio.gather(*jobs)
        except BaseException:
            for job in jobs:
                job.cancel()  # chunks not started yet are skipped
            raise
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    async def _in_child(
        self, tok: ModelTokenizer, texts: list[str], truncate: bool, first: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One bulk chunk in a tokenizer process; on this process's threads when a child died
        under it (the pool starts afresh for the next chunk) or the hop failed (OSError)."""
        assert self._procs is not None and tok.digest is not None
        pool = None
        try:
            args = (tok.digest, tok.model, texts, truncate, first)
            pool, job = self._procs.submit(ModelTokenizer, *args)
            return await asyncio.wrap_future(job)
        except (BrokenProcessPool, OSError) as exc:
            if pool is not None and isinstance(exc, BrokenProcessPool):
                self._procs.broken(pool, exc)
            fallback = self._pool.submit(
                int(Lane.BATCH), tok.encode_in_thread, texts, truncate, first
            )
            return await asyncio.wrap_future(fallback)

    def run(self, priority: Lane, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """``fn(*args)`` on the tokenizer threads at ``priority`` (for other encodings than
        ``encode``'s: a cross-encoder's pairs, :mod:`mesh.client.pairs`)."""
        return asyncio.wrap_future(self._pool.submit(int(priority), fn, *args))

    def close(self) -> None:
        self._pool.shutdown()
        if self._procs is not None:
            self._procs.close()

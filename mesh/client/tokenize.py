"""Tokenization off the event loop, with the catalog's tokenizer.

``tokenizers`` releases the GIL while it encodes, so a small thread pool tokenizes several
requests at once while the event loop keeps serving. Sequences are cut at the model's limit by
the tokenizer itself (so special tokens such as [SEP] stay, as sentence-transformers does); an
over-long input is refused unless the caller asked for truncation.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tokenizers import Tokenizer

from mesh.errors import InvalidInput
from proto_msgs import ModelInfo


class ModelTokenizer:
    """A tokenizer set up for one model: no padding, truncation at its input limit."""

    def __init__(self, tokenizer_json: bytes, model: ModelInfo) -> None:
        self.model = model
        self._tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        # Shipped tokenizer.json files often pad/cut to a fixed length (all-MiniLM-L6-v2's
        # pads to 128): packed batches want neither.
        self._tok.no_padding()
        self._tok.enable_truncation(model.max_input_tokens)
        self._full = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self._full.no_padding()
        self._full.no_truncation()

    def encode(self, texts: list[str], truncate: bool) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32, concatenated) and offsets (int32, n+1) for ``texts``."""
        encodings = (
            self._tok.encode_batch(texts) if len(texts) > 1 else [self._tok.encode(texts[0])]
        )
        if not truncate:
            for i, enc in enumerate(encodings):
                if enc.overflowing:
                    n = len(self._full.encode(texts[i]).ids)
                    raise InvalidInput(
                        f"input[{i}] has {n} tokens, over the model's limit of "
                        f"{self.model.max_input_tokens}; shorten it or ask for truncation"
                    )
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int32, count=len(texts))
        if lengths.min(initial=1) < 1:
            raise InvalidInput("an input tokenizes to nothing")
        offsets = np.zeros(len(texts) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter(
            (t for e in encodings for t in e.ids), dtype=np.int32, count=int(offsets[-1])
        )
        return ids, offsets


class TokenizerPool:
    """Tokenizers by digest, and the threads that run them."""

    def __init__(self, threads: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
        self._by_digest: dict[str, ModelTokenizer] = {}

    def get(self, digest: str) -> ModelTokenizer | None:
        return self._by_digest.get(digest)

    def add(self, digest: str, tokenizer_json: bytes, model: ModelInfo) -> ModelTokenizer:
        tok = ModelTokenizer(tokenizer_json, model)
        self._by_digest[digest] = tok
        return tok

    async def encode(
        self, tok: ModelTokenizer, texts: list[str], truncate: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, tok.encode, texts, truncate)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

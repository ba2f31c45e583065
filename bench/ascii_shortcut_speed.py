"""What the ASCII shortcut (mesh/client/ascii_shortcut.py) and the word memo
(mesh/client/word_memo.py) save: the embedded MiniLM's ``ModelTokenizer.encode`` over the
corpus in 64-text calls, one thread, with both (``memo``, what a tokenizer process and the
event loop run), with the shortcut alone (``shortcut``, what a pool thread runs:
``encode_in_thread``) and with neither (``full``), alternated; best of ``--rounds`` per
variant, µs per token.

    python bench/ascii_shortcut_speed.py [--rounds 5]

Tokenizers' own thread pool is off (as in the ingress's tokenizer processes), so this is one
core's cost. The ids are checked equal before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before tokenizers is imported

import numpy as np  # noqa: E402

from mesh.client.tokenize import ModelTokenizer  # noqa: E402
from mesh.worker.engine.card import default_model_path, read_card  # noqa: E402
from proto_msgs import ModelInfo  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.jsonl"


def tokenizer(shortcut: bool) -> ModelTokenizer:
    card = read_card(default_model_path())
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, 30522, "mean", True, "d")
    tok = ModelTokenizer(card.tokenizer_json, info)
    if not shortcut:
        tok._shortcut.tokenizer = None  # split() then sends every text the full way
    return tok


def timed(tok: ModelTokenizer, calls: list[list[str]], memo: bool) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = sum(int(tok.encode(texts, True, memo=memo)[1].sum()) for texts in calls)
    return time.perf_counter() - start, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with CORPUS.open() as f:
        texts = [json.loads(line)["text"] for line in f]
    calls = [texts[i : i + 64] for i in range(0, len(texts), 64)]
    on, off = tokenizer(True), tokenizer(False)
    for call in calls:
        want = off.encode(call, True, memo=False)
        for got in (on.encode(call, True), on.encode(call, True, memo=False)):
            assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
    variants = (("full", off, False), ("shortcut", on, False), ("memo", on, True))
    best = {name: float("inf") for name, _, _ in variants}
    tokens = 0
    for _ in range(args.rounds):
        for name, tok, memo in variants:
            seconds, tokens = timed(tok, calls, memo)
            best[name] = min(best[name], seconds)
    ascii_share = sum(t.isascii() for t in texts) / len(texts)
    print(f"{len(texts)} corpus texts ({ascii_share:.0%} ASCII), {tokens} tokens, 64 a call")
    for name, seconds in best.items():
        print(
            f"{name:9s} {seconds / tokens * 1e6:.3f} µs a token, {tokens / seconds / 1e6:.3f} M/s"
        )
    for name in ("shortcut", "memo"):
        print(f"{name} saves {1 - best[name] / best['full']:.0%} of the tokenizing time")


if __name__ == "__main__":
    main()

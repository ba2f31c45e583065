"""BERT-style tokenizing of ASCII texts from a memo of each word's WordPiece ids.

A WordPiece tokenizer with ``BertPreTokenizer`` encodes a text word by word: the normalized
text is split at whitespace and around each punctuation character, and each word's pieces
depend on that word alone. On the texts an index is built from, a few thousand distinct words
make up almost all of the tokens, so each word's ids are asked of the tokenizer's own model
once (``Tokenizer.model.tokenize``) and kept; a text is then its words found by a regular
expression and looked up, in C loops (``re.findall``, ``map(dict.get)``,
``itertools.chain``). Measured on the embedded MiniLM over the corpus in 64-text calls, one
thread: 0.37-0.42 µs a token against 1.18-1.24 for the ASCII shortcut alone (timed on
the same texts); tokenizing is most of an ingress tier's CPU, which is
what bounds MiniLM's throughput through HTTP on the H200 (docs/tuning.md).

Only ``ModelTokenizer.encode`` (ids and lengths) uses it; callers that need offsets, word ids
or type ids get the tokenizer's encodings. The ids are the tokenizer's whenever all hold:

- the text may take the ASCII shortcut (mesh/client/ascii_shortcut.py: ASCII, a normalizer
  whose ASCII result is known, no added token's text), which normalizes it;
- the tokenizer's pre-tokenizer is ``BertPreTokenizer`` and its model ``WordPiece``: on ASCII
  text the split is whitespace (``\\t \\n \\v \\f \\r`` and space, Rust's
  ``char::is_whitespace``) and ASCII punctuation (Rust's ``is_ascii_punctuation``), which
  ``_WORDS`` writes out;
- the post-processor adds the same tokens around every single text (BERT's ``[CLS] $A
  [SEP]``), read off the tokenizer's own encoding of a probe word, and truncation keeps the
  first ``max_tokens`` less those; a text longer than the cut (``ModelTokenizer.cut_chars``)
  is split from its cut piece up to where no added token's match could still begin, less the
  last word there (the cut or that bound may split it), and goes the full way unless that
  already overflows (the character after the cut must be ASCII too: a unicode normal form
  could join it to the piece's last).

A self-check at start compares the memo's ids and overflow with the tokenizer's on probe
texts (and the added tokens beside words) and turns the memo off with a warning on any
difference, as the shortcut does.
"""

from __future__ import annotations

import itertools
import logging
import re
from typing import Any

from tokenizers import Tokenizer

from mesh.client.ascii_shortcut import PROBES, AsciiShortcut

log = logging.getLogger("embedmesh.client")

# ASCII punctuation as Rust's is_ascii_punctuation has it: ! to /, : to @, [ to `, { to ~.
_PUNCT = r"!-/:-@\[-`{-~"
# A word: a run of anything but whitespace and punctuation; or one punctuation character.
_WORDS = re.compile(rf"[^\t\n\x0b\x0c\r {_PUNCT}]+|[{_PUNCT}]")
# Words and pieces kept at most; past either the memo starts again (a few thousand words carry
# most tokens: what it drops is found again at once). Ids are shared int objects, so a piece
# costs a pointer: at the bounds a few tens of MB a process, however odd the words.
MAX_WORDS = 100_000
MAX_PIECES = 1_000_000
# Longer words are looked up in the model each time, not kept: a stream of unique long strings
# (ids, hashes, base64) would fill the memo with words seen once.
MAX_WORD_CHARS = 32
# The shortcut's probes, and these: punctuation then a word, words of several pieces, blanks.
_PROBES = [
    *PROBES,
    "Hello, World! UPPER lower MiXeD 123 $%^&*()_+-=[]{};':\",./<>?`~|\\ x",
    "unaffable unbelievably tokenization preprocessing antidisestablishmentarianism",
    "   ",
]


class WordMemo:
    """For one tokenizer: ids of texts that may take it, from each word's memoized pieces."""

    def __init__(
        self,
        spec: dict[str, Any],
        configured: Tokenizer,
        shortcut: AsciiShortcut,
        max_tokens: int,
        cut_chars: int,
        enabled: bool = True,
    ) -> None:
        """``spec``: the tokenizer.json, parsed; ``configured``: the model's tokenizer with
        its truncation at ``max_tokens``;
        ``shortcut``: its ASCII shortcut; ``cut_chars``: where a long text is cut;
        ``enabled``: False leaves it off."""
        self.on = False
        self._shortcut = shortcut
        self._cut = cut_chars
        self._memo: dict[str, tuple[int, ...]] = {}
        self._stored = 0  # pieces in the memo (approximate under threads: a bound, not a count)
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        self._room = 0
        plain = shortcut.tokenizer
        pre = (spec.get("pre_tokenizer") or {}).get("type")
        model = (spec.get("model") or {}).get("type")
        if not enabled or plain is None or pre != "BertPreTokenizer" or model != "WordPiece":
            return
        self._model = plain.model
        # One int object per id, shared by every memo entry (a fresh int is 28 bytes).
        self._ints = list(range(plain.get_vocab_size(with_added_tokens=True)))
        # What the post-processor puts around a text: around the pieces of a probe word.
        probe = "a"
        pieces = list(self._pieces(probe))
        ids = plain.encode(probe).ids
        at = next((i for i in range(len(ids)) if ids[i : i + len(pieces)] == pieces), None)
        if not pieces or at is None:
            return
        self._prefix, self._suffix = ids[:at], ids[at + len(pieces) :]
        self._room = max_tokens - len(self._prefix) - len(self._suffix)
        if self._room < 1:
            return
        self.on = True
        if not self._agrees(configured, spec):
            log.warning("word memo off for a tokenizer: it gave other ids on probe texts")
            self.on = False
            self._memo.clear()

    def _pieces(self, word: str) -> tuple[int, ...]:
        ints = self._ints
        return tuple(ints[token.id] for token in self._model.tokenize(word))

    def _agrees(self, configured: Tokenizer, spec: dict[str, Any]) -> bool:
        """Whether the memo gives the tokenizer's ids and overflow on probe texts: the
        shortcut's, added tokens beside words, and texts over the limit and over the cut."""
        probes = [*_PROBES]
        for token in spec.get("added_tokens", [])[:64]:
            content = token.get("content") or ""
            probes += [f"x {content} y", f"x{content.lower()}y"]
        probes += [
            " ".join(["word"] * (self._room + 5)),
            "w " * (self._cut // 2 + 10),
            "abc," * (self._cut // 4 + 10),
        ]
        for text in probes:
            ours = self.ids(text)
            if ours is None:
                continue
            enc = configured.encode(text)
            if ours != (enc.ids, bool(enc.overflowing)):
                return False
        self._memo.clear()  # the probes' words are not the texts'
        self._stored = 0
        return True

    def ids(self, text: str) -> tuple[list[int], bool] | None:
        """``text``'s ids and whether it overflowed the limit (its ids then cut at it), or
        None: it goes the tokenizer's way."""
        cut = len(text) > self._cut
        longest = self._shortcut.longest_added
        if cut:
            piece = text[: self._cut]
            # Past the cut: an added token's text that starts in the piece, and (at least) the
            # next character, which a unicode normal form could combine with the piece's last.
            search = text[: self._cut + max(1, longest)]
            norm = self._shortcut.normalized(piece, search)
        else:
            norm = self._shortcut.normalized(text)
        if norm is None:
            return None
        if cut:
            # Only up to where no added token's match can still begin (one running past the
            # piece, spelled in a case or with a character the raw search does not match, would
            # take words before the cut), less the last word there, which may be split.
            words = _WORDS.findall(norm, 0, max(0, len(norm) - max(longest - 1, 0)))
            del words[-1:]
        else:
            words = _WORDS.findall(norm)
        memo = self._memo
        got = list(map(memo.get, words))
        if None in got:
            if len(memo) > MAX_WORDS or self._stored > MAX_PIECES:
                memo.clear()
                self._stored = 0
            for i, word in enumerate(words):
                if got[i] is None:
                    pieces = got[i] = self._pieces(word)
                    if len(word) <= MAX_WORD_CHARS:
                        memo[word] = pieces
                        self._stored += len(pieces)
        flat = list(itertools.chain.from_iterable(got))  # type: ignore[arg-type]
        over = len(flat) > self._room
        if cut and not over:
            return None  # the rest of the text may hold the tokens it still has room for
        return self._prefix + flat[: self._room] + self._suffix, over

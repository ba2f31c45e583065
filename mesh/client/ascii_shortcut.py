"""Normalizing ASCII texts in Python, so that the tokenizer skips its own normalizer.

Measured on MiniLM's WordPiece (tokenizers 0.23, one thread, the corpus in 64-text calls):
the ``BertNormalizer`` is a third of the tokenizer's time, 1.73 µs a token with it against
1.15 without it. Most of that is the bookkeeping a ``NormalizedString`` keeps (an alignment per
character, for offsets), not the normalizing itself: on an ASCII text the whole normalizer is
``str.translate`` (clean_text: drop control characters, whitespace to spaces) and
``str.lower``, both C loops over the string in CPython. Bulk tokenization is most of an
ingress tier's CPU, which is what bounds MiniLM's throughput through HTTP on the H200
(docs/tuning.md), so an ASCII text goes to a copy of the tokenizer without a normalizer, already
normalized.

The ids are the same only where the normalizer's result is known exactly, so a text takes the
shortcut only when all of these hold:

- the text is ASCII (``str.isascii`` reads a flag CPython keeps: no scan). On ASCII, BERT's
  accent stripping and Chinese-character spacing, and the unicode normal forms, change nothing;
- every step of the normalizer is one whose ASCII result is written here (``BertNormalizer``,
  ``Lowercase``, ``NFC``/``NFD``/``NFKC``/``NFKD``, a ``Sequence`` of them); any other step
  (``Replace``, ``Precompiled``, ``Strip``, ...) turns the shortcut off for the model;
- neither the text nor its normalized form contains an added token's content (``[CLS]``,
  ``<s>``, ...) or, for a ``normalized`` added token, its content normalized: the tokenizer
  matches the first kind on the raw text before normalizing, which a tokenizer handed
  normalized text cannot repeat, and the second by its normalized form, which a tokenizer
  without a normalizer no longer computes. Such texts take the full path.

Everything after the normalizer (pre-tokenizer, model, truncation, post-processor) is the same
object configuration, so the encodings carry the same ids, type ids, overflow and word ids.
Offsets would point into the normalized text: callers that need offsets (TEI's /tokenize)
use the full tokenizer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

# ASCII's characters that BERT's clean_text treats as controls (Cc, less \t \n \r): dropped.
# \t \n \r and space are its whitespace: mapped to a space.
_CLEAN = {**{c: None for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]},
          0x09: 0x20, 0x0A: 0x20, 0x0D: 0x20}  # fmt: skip
_UNICODE_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
# What a shortcut must encode as the full tokenizer does before it is used (AsciiShortcut._agrees;
# the word memo's self-check starts from them too).
PROBES = [
    "Hello, World! UPPER lower MiXeD 123 $%^&*()_+-=[]{};':\",./<>?`~|\\",
    "tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeeds \x00\x01\x1f\x7f in w\x07ords",
    "x" * 120 + " past a 100-character word, don't e-mail me@example.com (v2.0)",
    "",
    "\x00\x01",
]

Step = Callable[[str], str]
log = logging.getLogger("embedmesh.client")


def _steps(spec: dict[str, Any] | None) -> list[Step] | None:
    """What ``spec`` (a tokenizer.json normalizer) does to an ASCII text, as str methods in
    order; None when some step's ASCII result is not known here."""
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        steps: list[Step] = []
        for part in spec.get("normalizers", []):
            more = _steps(part)
            if more is None:
                return None
            steps.extend(more)
        return steps
    if kind in _UNICODE_FORMS:
        return []
    if kind == "Lowercase":
        return [str.lower]
    if kind == "BertNormalizer":
        steps = []
        if spec.get("clean_text", True):
            steps.append(lambda text: text.translate(_CLEAN))
        if spec.get("lowercase", True):
            steps.append(str.lower)
        return steps
    return None


class AsciiShortcut:
    """For one tokenizer: which texts may skip its normalizer, and those texts normalized."""

    def __init__(self, spec: dict[str, Any], configured: Tokenizer) -> None:
        """``spec``: the tokenizer.json, parsed; ``configured``: the model's tokenizer with its
        truncation and padding already set. The shortcut's tokenizer is a copy of it without
        the normalizer."""
        steps = _steps(spec.get("normalizer"))
        # An added token is matched by its content on the raw text, or (``normalized``, the
        # default of ``add_tokens`` for plain tokens) by its content normalized, on the
        # normalized text: a text holding either form goes the full way. The content itself
        # may be non-ASCII ("Café" matching "cafe"), so the tokenizer's own normalizer says it.
        contents: set[str] = set()
        for token in spec.get("added_tokens", []):
            content = token.get("content") or ""
            contents.add(content)
            if token.get("normalized") and configured.normalizer is not None:
                contents.add(configured.normalizer.normalize_str(content))
        contents.discard("")  # an empty alternative would match every text
        # The longest text an added-token match can span: how far past a cut to look.
        self.longest_added = max(map(len, contents), default=0)
        self.tokenizer: Tokenizer | None = None
        if steps:  # none (no normalizer, or an ASCII no-op one): nothing to save
            self.tokenizer = Tokenizer.from_str(configured.to_str())
            self.tokenizer.normalizer = None
        self._steps = steps or []
        # Longest first: an alternation tries its branches in order.
        pattern = "|".join(map(re.escape, sorted(contents, key=len, reverse=True)))
        self._added = re.compile(pattern) if pattern else None
        if self.tokenizer is not None and not self._agrees(configured, contents):
            # A tokenizer whose behaviour this module has not foreseen: correct ids first.
            log.warning("ASCII shortcut off for a tokenizer: it gave other ids on probe texts")
            self.tokenizer = None

    def _agrees(self, configured: Tokenizer, contents: set[str]) -> bool:
        """Whether the shortcut gives the full tokenizer's encodings on probe texts: ASCII
        built to trip the normalizer, and each added token's text in other cases and beside
        others' (most of them go the full way; those that do not must agree). About 1 ms."""
        probes = [*PROBES]
        for content in sorted(contents)[:64]:
            probes += [f"x {content} y", f"x{content.lower()}y", f"X {content.upper()}"]
        indices, normalized = self.split(probes)
        if not indices:
            return True
        assert self.tokenizer is not None
        ours = self.tokenizer.encode_batch(normalized)
        theirs = configured.encode_batch([probes[i] for i in indices])
        return all(
            (a.ids, a.type_ids, a.word_ids) == (b.ids, b.type_ids, b.word_ids)
            for a, b in zip(ours, theirs, strict=True)
        )

    def normalize(self, text: str) -> str:
        for step in self._steps:
            text = step(text)
        return text

    def split(self, texts: list[str]) -> tuple[list[int], list[str]]:
        """The indices of ``texts`` that may take the shortcut, and those texts normalized
        (nothing when the tokenizer has no shortcut)."""
        if self.tokenizer is None:
            return [], []
        indices: list[int] = []
        normalized: list[str] = []
        for i, text in enumerate(texts):
            norm = self.normalized(text)
            if norm is not None:
                indices.append(i)
                normalized.append(norm)
        return indices, normalized

    def normalized(self, text: str, search: str | None = None) -> str | None:
        """``text`` normalized when it may take the shortcut, else None. ``search``: the
        text to look for added tokens in, when ``text`` is a cut piece of it (a token that
        straddles the cut must still send the text the full way)."""
        if not text.isascii() or (search is not None and not search.isascii()):
            return None
        norm = self.normalize(text)
        added = self._added
        if added is not None and (added.search(search or text) or added.search(norm)):
            return None
        return norm

"""Decode-time size limits: anything larger is a ProtocolError, never an allocation."""

from __future__ import annotations

MAX_FRAMES = 256  # header + body + payload frames of one message
MAX_BODY_BYTES = 4 << 20  # msgpack body (catalogs with many models stay far under this)
MAX_ARRAY_BYTES = 1 << 30  # one raw payload frame (token ids or vectors)
MAX_SEQUENCES = 1 << 16  # sequences in one SUBMIT or one BATCH
MAX_TOKENS = 1 << 24  # token ids in one SUBMIT or one BATCH
MAX_DIMS = 1 << 16  # embedding width
# (id, weight) pairs in one sparse row: a whole vocabulary (every weight, as TEI returns them;
# bge-m3's 250,002 entries, Gemma's 262,144)
MAX_SPARSE_TOP_K = 1 << 18
MAX_STRING = 1 << 16  # characters in any string field

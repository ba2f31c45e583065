"""Shared fixtures of the engine tests: the embedded model and its tokenizer, and the fused
kernels run by Triton's interpreter."""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

# Before transformers/sentence-transformers are imported anywhere: never reach for the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest
from tokenizers import Tokenizer

from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.kernels import fused


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_dir: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    # The shipped tokenizer.json pads and truncates to 128; sentence-transformers overrides
    # both, and so does the ingress.
    tok.no_padding()
    tok.enable_truncation(256)
    return tok


@pytest.fixture(scope="module")
def kernels():
    """``fused`` with its kernels run by Triton's interpreter, restored afterwards (so that
    GPU tests later in the same session get compiled kernels again)."""
    pytest.importorskip("triton", reason="the fused kernels need triton (extra 'triton')")
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    _redecorate()
    yield fused
    if before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = before
    _redecorate()


def _redecorate() -> None:
    # TRITON_INTERPRET is read when triton.jit decorates a function, and fused was imported
    # (through the engine) before this module ran, so reload it. Reloading fused alone is
    # not enough: tl.sum and tl.sigmoid are triton.jit functions of triton.language.standard
    # decorated when triton was imported, and an interpreted kernel cannot call compiled
    # ones ("Cannot call @triton.jit'd outside of the scope of a kernel"). So reload that
    # module too and rebind the names triton.language re-exports from it.
    import triton.language as tl
    import triton.language.standard as standard

    exported = [
        name
        for name, value in vars(standard).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and getattr(tl, name, None) is value
    ]
    importlib.reload(standard)
    for name in exported:
        setattr(tl, name, getattr(standard, name))
    importlib.reload(fused)

"""Shared fixtures of the engine tests: the embedded model and its tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

# Before transformers/sentence-transformers are imported anywhere: never reach for the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest
from tokenizers import Tokenizer

from mesh.worker.engine.card import default_model_path


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

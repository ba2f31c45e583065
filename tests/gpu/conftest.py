"""GPU tests: skipped without CUDA or flashinfer; the tests/gpu folder is importable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    reason = None
    if not torch.cuda.is_available():
        reason = "needs CUDA"
    else:
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            reason = "needs flashinfer (the gpu extra)"
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))

"""Environment variables for a test: set to a value, or absent (``None``)."""

from __future__ import annotations

import pytest


def set_or_unset(monkeypatch: pytest.MonkeyPatch, name: str, value: str | None) -> None:
    """``name`` set to ``value``, or removed when ``value`` is None; restored after the test."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)

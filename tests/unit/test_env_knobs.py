"""mesh.env_knobs: a numeric EMBEDMESH_* knob is its value when a number in range, else the
default, with a warning that names the variable, its range and what is used instead."""

from __future__ import annotations

import logging

import pytest

from mesh.env_knobs import float_from_env, switch_from_env
from tests.envs import set_or_unset

LOG = logging.getLogger("embedmesh.test")


@pytest.mark.parametrize(
    ("raw", "want", "warns"),
    [
        (None, 3.0, False),
        ("", 3.0, False),
        ("  ", 3.0, False),
        ("0", 0.0, False),
        (" 7.5 ", 7.5, False),
        ("20", 20.0, False),
        ("20.001", 3.0, True),
        ("-0.5", 3.0, True),
        ("nan", 3.0, True),
        ("inf", 3.0, True),
        ("-inf", 3.0, True),
        ("1e400", 3.0, True),
        ("soon", 3.0, True),
    ],
)
def test_a_knob_is_its_value_in_range_else_the_default(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    raw: str | None,
    want: float,
    warns: bool,
) -> None:
    set_or_unset(monkeypatch, "EMBEDMESH_TEST_KNOB", raw)
    with caplog.at_level("WARNING", logger=LOG.name):
        assert float_from_env("EMBEDMESH_TEST_KNOB", 3.0, 0.0, 20.0, "ms", LOG) == want
    assert ("EMBEDMESH_TEST_KNOB=" in caplog.text) == warns
    if warns:
        assert "is not 0..20: using 3 ms" in caplog.text


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("0", False),
        ("false", False),
        ("No", False),
        (" OFF ", False),
        ("1", True),
        ("on", True),
        ("yes", True),
    ],  # fmt: skip
)
def test_a_switch_is_off_only_when_said_so(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, want: bool | None
) -> None:
    set_or_unset(monkeypatch, "EMBEDMESH_TEST_SWITCH", raw)
    assert switch_from_env("EMBEDMESH_TEST_SWITCH") is want

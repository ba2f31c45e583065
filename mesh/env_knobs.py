"""Measuring knobs and switches read from the environment (``EMBEDMESH_*``), for settings that
are not flags of ``mesh-launch``: a number outside its range, or not a number, warns and keeps
the default, so a typo never stops a process. Each is declared in ``launch/options.py`` (a
field with ``flag=False``), so it has a ``--config`` key too: the launcher puts a value from
the file into the environment, where these readers find it."""

from __future__ import annotations

import logging
import os


def float_from_env(
    name: str, default: float, low: float, high: float, unit: str, log: logging.Logger
) -> float:
    """``name``'s value when it is a number in ``low..high``; ``default`` when unset or bad."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")  # outside every range
    if not low <= value <= high:
        log.warning("%s=%r is not %g..%g: using %g %s", name, raw, low, high, default, unit)
        return default
    return value


OFF = ("0", "false", "no", "off")


def switch_from_env(name: str) -> bool | None:
    """A switch: None when unset or blank (the caller's default), False for one of OFF (any
    case), True for anything else."""
    value = os.environ.get(name, "").strip().lower()
    return None if value == "" else value not in OFF

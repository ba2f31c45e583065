"""The ``--config`` file: TOML, one table per section of :mod:`launch.options`, its keys the
option names. Read it, print the effective one (``--print-config``), and write the reference
(docs/config.md). A value set in several places: the flag, then its ``EMBEDMESH_<NAME>``
variable, then this file, then the default.
"""

from __future__ import annotations

import json
import os
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import click

from launch.options import Declared, LaunchArgs, declared

HEADER = """\
# embedmesh configuration: mesh-launch --config FILE (or EMBEDMESH_CONFIG=FILE).
# One table per section, keys as the options are named. Where a setting is given in several
# places, the command-line flag wins, then its EMBEDMESH_<NAME> variable, then this file, then
# the default. A commented-out key is unset: its default applies. One file can serve every
# role: each role reads the keys that apply to it.
"""


class ConfigError(click.BadParameter):
    """A config file that cannot be used: unreadable, not TOML, an unknown key, a bad value."""


def configurable() -> list[Declared]:
    return [d for d in declared() if not d.spec.internal]


def load(path: Path, role: str = "all") -> dict[str, Any]:
    """Option name -> value, from the file at ``path``, for the options that apply to ``role``
    (checked by their click type). Every key must be known; the values of other roles' keys
    are not read (a model directory on the worker hosts need not exist on the broker's)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}", param_hint="--config") from None
    known = {(d.section, d.name): d for d in configurable()}
    values: dict[str, Any] = {}
    for section, table in doc.items():
        if not isinstance(table, dict) or section not in {d.section for d in known.values()}:
            raise ConfigError(
                f"{path}: [{section}] is not a section; the sections are "
                + ", ".join(sorted({s for s, _ in known})),
                param_hint="--config",
            )
        for name, raw in table.items():
            if (section, name) not in known:
                names = ", ".join(n for s, n in known if s == section)
                raise ConfigError(
                    f"{path}: [{section}] has no key {name!r}; its keys: {names}",
                    param_hint="--config",
                )
            option = known[(section, name)]
            if option.spec.applies_to(role):
                values[name] = convert(option, raw, f"{path}: [{section}] {name}")
    return values


def convert(option: Declared, raw: Any, where: str) -> Any:
    """``raw`` as the option's type (click's conversion and range checks)."""
    kind = option.spec.type or click.BOOL
    try:
        if option.spec.multiple:
            items = raw.split() if isinstance(raw, str) else list(raw)
            return tuple(kind.convert(item, None, None) for item in items)
        return kind.convert(raw, None, None)
    except (click.BadParameter, TypeError) as exc:
        message = exc.message if isinstance(exc, click.BadParameter) else str(exc)
        raise ConfigError(f"{where}: {message}", param_hint="--config") from None


def resolve_knobs(from_file: dict[str, Any]) -> dict[str, Any]:
    """The values of the options without a flag: their variable, else the file, else the
    default. A value from the file is put into the environment, where the modules that read
    these knobs (and the children of ``--role all``) find it. A variable the type cannot read
    is left to its module, which warns and keeps the default."""
    values: dict[str, Any] = {}
    for option in configurable():
        if option.spec.flag:
            continue
        raw = os.environ.get(option.env, "").strip()
        if raw:
            try:
                values[option.name] = convert(option, raw, option.env)
            except ConfigError:
                values[option.name] = option.default
        elif option.name in from_file:
            values[option.name] = from_file[option.name]
            os.environ[option.env] = env_text(from_file[option.name])
    return values


def env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple | list):
        return " ".join(str(v) for v in value)
    return str(value)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string


def _default_text(option: Declared) -> str:
    if option.spec.default_text:
        return option.spec.default_text
    if option.default is None or option.default in ((), ""):
        return "unset"
    return _toml(option.default)


def render(args: LaunchArgs) -> str:
    """The effective configuration as a TOML file: every key, with its help, its variable,
    its flag and its default in comments; unset keys commented out; the API key never."""
    lines = [HEADER]
    for section in ("link", "broker", "worker", "ingress", "supervisor"):
        lines.append(f"[{section}]")
        for option in configurable():
            if option.section != section:
                continue
            flag = f", {option.flag}" if option.spec.flag else ""
            lines += textwrap.wrap(
                option.spec.help, 98, initial_indent="# ", subsequent_indent="# "
            )
            lines.append(f"# {option.env}{flag}; default: {_default_text(option)}")
            value = args.value(option.name)
            unset = value is None or value == () or option.spec.secret
            shown = '"..."' if option.spec.secret else ("" if unset else _toml(value))
            lines.append(f"{'# ' if unset else ''}{option.name} = {shown}".rstrip())
        lines.append("")
    return "\n".join(lines)


def reference() -> str:
    """docs/config.md: every key, its variable, its flag, its default and what it does."""
    out = [
        "# Configuration reference",
        "",
        "Every setting of `mesh-launch`, generated from `launch/options.py` (a test fails when",
        "this page is out of date: `python -m launch.config_file > docs/config.md`).",
        "A setting is given by its flag, its `EMBEDMESH_<NAME>` environment variable, or its key",
        "in the TOML file named by `--config` (or `EMBEDMESH_CONFIG`); the flag wins, then the",
        "variable, then the file, then the default. `mesh-launch --print-config` prints the",
        "effective file. Settings without a flag (—) are expert knobs; flags marked *expert*",
        "are left out of `--help`. A flag given to a role it does not apply to is refused;",
        "variables and keys of other roles are ignored, so one file can serve every role.",
        "",
        "One file for every host of a mesh, each host starting its role with `--config`:",
        "",
        "```toml",
        "[link]",
        'curve_dir = "/etc/embedmesh/keys"',
        "# --broker differs by role: each worker passes the backend, each ingress the frontend",
        "",
        "[broker]",
        'frontend = "tcp://10.0.0.5:5555"',
        'backend = "tcp://10.0.0.5:5556"',
        "",
        "[worker]",
        'device = "cuda"',
        'model = "/models/bge-base-en-v1.5"',
        "",
        "[ingress]",
        'http_host = "0.0.0.0"',
        "ingress_procs = 4",
        "bulk_nice = 10",
        "```",
        "",
    ]
    for section in ("link", "broker", "worker", "ingress", "supervisor"):
        out += [f"## [{section}]", ""]
        out += ["| key | variable | flag | default | roles | what it does |"]
        out += ["| --- | --- | --- | --- | --- | --- |"]
        for option in configurable():
            if option.section != section:
                continue
            spec = option.spec
            flag = f"`{option.flag}`" + (" *expert*" if spec.expert else "") if spec.flag else "—"
            roles = ", ".join(
                r for r in ("broker", "worker", "ingress", "all") if spec.applies_to(r)
            )
            default = _default_text(option)
            row = [f"`{option.name}`", f"`{option.env}`", flag, default, roles, spec.help]
            out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")

"""The argv of a role process the launcher starts, built from the options object: a flag for
each option that applies to the child's role and is set, never from hand-kept lists."""

from __future__ import annotations

from typing import Any

from launch.options import Declared, LaunchArgs, declared


def flags_of(option: Declared, value: Any) -> list[str]:
    """``--name value`` (repeated for a list; ``--name`` alone for a true flag; nothing unset)."""
    if value is None or value is False or value == "" or value == ():
        return []
    if value is True:
        return [option.flag]
    if isinstance(value, tuple | list):
        return [arg for item in value for arg in (option.flag, str(item))]
    return [option.flag, str(value)]


def child_argv(args: LaunchArgs, role: str, **chosen: Any) -> list[str]:
    """``--role ROLE``, then the options the launcher ``chosen`` for this child (endpoints,
    devices, threads), then every other option of ``args`` that applies to ``role``. Secrets
    and what the launcher keeps (the API key's sources) never travel in argv: any user can
    read a command line."""
    options = {o.name: o for o in declared()}
    argv = ["--role", role]
    for name, value in chosen.items():
        argv += flags_of(options[name], value)
    for option in options.values():
        spec = option.spec
        if option.name in chosen or not spec.flag or not spec.to_children:
            continue
        if spec.applies_to(role):
            argv += flags_of(option, args.value(option.name))
    return argv

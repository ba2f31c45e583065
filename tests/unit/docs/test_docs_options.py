"""Every ``--flag`` and every ``EMBEDMESH_*`` variable that README.md, docs/ and bench/README.md
name exists: an option of ``mesh-launch`` (launch/options.py's declarations and its top
options), of ``mesh-embed``, of a ``mesh-bench`` command, or one of the few other tools' flags
listed here."""

from __future__ import annotations

import contextlib
import io
import re
from functools import cache
from pathlib import Path

import click
import pytest

from tests.doc_blocks import ROOT

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_VARIABLE = re.compile(r"EMBEDMESH_[A-Z0-9_]+")

# Flags of other programs the pages show, with the program they belong to.
OTHER_TOOLS = {
    "--local-dir": "hf download",
    "--build-arg": "docker build",
    "--rm": "docker run",
    "--health-cmd": "docker run",
    "--stop-timeout": "docker run",
    "--image": "kubectl run",
    "--restart": "kubectl run",
    "--overrides": "kubectl run",
    "--dry-run": "kubectl apply",
    "--from-file": "kubectl create configmap",
    "--write": "python -m mesh.ingress.api_markdown",
    "--upstream": "python -m bench.faultproxy",
}


def reference_pages() -> list[Path]:
    """README.md, the pages of docs/ and mesh-bench's guide (not the CHANGELOG: it keeps the
    names of removed flags)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench/README.md"]
    return [page for page in pages if page.exists()]


def _click_names(command: click.Command) -> tuple[set[str], set[str]]:
    """(flags, variables) of a click command's options, hidden ones included."""
    flags, variables = {"--help"}, set()
    for param in command.params:
        if isinstance(param, click.Option):
            flags |= {o for o in [*param.opts, *param.secondary_opts] if o.startswith("--")}
            envvar = param.envvar
            variables |= set([envvar] if isinstance(envvar, str) else envvar or [])
    return flags, variables


def _argparse_flags(command: click.Command) -> set[str]:
    """The flags a pass-through ``mesh-bench`` command's argparse ``main`` prints in --help."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        click.Context(command).invoke(command.callback, args=("--help",))  # type: ignore[arg-type]
    return set(_FLAG.findall(out.getvalue()))


@cache
def known() -> tuple[frozenset[str], frozenset[str]]:
    """(flags, variables) that exist, from the commands' own declarations."""
    from bench.cli import main as bench
    from launch.cli import main as launch
    from launch.options import declared
    from mesh.embed_cli.cli import command as embed

    flags, variables = _click_names(launch)
    variables |= {option.env for option in declared()}  # the expert knobs have no flag
    embed_flags, embed_variables = _click_names(embed)
    flags, variables = flags | embed_flags, variables | embed_variables
    ctx = click.Context(bench)
    for name in bench.list_commands(ctx):
        command = bench.get_command(ctx, name)
        assert command is not None
        if any(isinstance(p, click.Option) for p in command.params):
            flags |= _click_names(command)[0]
        elif name != "gpu-proof":  # gpu-proof takes arguments only
            flags |= _argparse_flags(command)
    return frozenset(flags | set(OTHER_TOOLS)), frozenset(variables)


@pytest.mark.parametrize("page", reference_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_a_page_names_exists(page: Path) -> None:
    flags, _ = known()
    assert sorted(set(_FLAG.findall(page.read_text())) - flags) == []


@pytest.mark.parametrize("page", reference_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_embedmesh_variable_a_page_names_exists(page: Path) -> None:
    _, variables = known()
    assert sorted(set(_VARIABLE.findall(page.read_text())) - variables) == []


def test_the_check_finds_a_flag_and_a_variable_that_do_not_exist() -> None:
    flags, variables = known()
    assert "--http-port" in flags and "--test-hang-after" not in flags
    assert "EMBEDMESH_LIVE_GATE_MS" in variables and "EMBEDMESH_TEST_HANG_AFTER" not in variables
    assert "--no-baseline" in flags and "--frames" in flags and "--families" in flags


def toml_examples() -> list[tuple[str, str]]:
    """(page, text) of each ``toml`` fenced block of the guides (config.md's own example is
    tested with the reference, in tests/unit/test_launch_options.py)."""
    found = []
    for page in reference_pages():
        if page.name == "config.md":
            continue
        for i, block in enumerate(page.read_text().split("```toml\n")[1:]):
            found.append((f"{page.relative_to(ROOT)}#{i}", block.split("```")[0]))
    return found


@pytest.mark.parametrize("where,text", toml_examples(), ids=[w for w, _ in toml_examples()])
def test_every_config_example_of_the_guides_loads(where: str, text: str, tmp_path: Path) -> None:
    from launch.config_file import load

    path = tmp_path / "example.toml"
    path.write_text(text)
    assert load(path, "all"), f"{where}: no setting read"

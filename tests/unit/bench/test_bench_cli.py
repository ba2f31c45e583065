"""mesh-bench's command line: the first word picks the harness, none means ``http``; harnesses
load only when they run; nothing in bench/ imports the tests."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bench import cli

BENCH = Path(cli.__file__).resolve().parent
seen: list[tuple[str, ...]] = []


@click.command()
@click.option("--mode", multiple=True)
@click.option("--url")
def record(mode: tuple[str, ...], url: str | None) -> None:
    seen.append((*mode, url or ""))


@pytest.fixture
def http_recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    seen.clear()
    monkeypatch.setitem(cli.HARNESSES, "http", (__name__, "record", "recorded"))
    return seen


def test_options_without_a_command_name_go_to_http(http_recorded: list) -> None:
    result = CliRunner().invoke(cli.main, ["--mode", "mixed", "--url", "http://h/v1"])
    assert result.exit_code == 0, result.output
    assert http_recorded == [("mixed", "http://h/v1")]


def test_http_by_name_and_no_arguments_at_all_run_http_too(http_recorded: list) -> None:
    assert CliRunner().invoke(cli.main, ["http", "--mode", "hops"]).exit_code == 0
    assert CliRunner().invoke(cli.main, []).exit_code == 0
    assert http_recorded == [("hops", ""), ("",)]


def test_help_lists_every_command_without_importing_a_harness() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from bench.cli import main; "
        "out = CliRunner().invoke(main, ['--help']).output; "
        "print(sorted(m for m in sys.modules if m.startswith('bench.') or m == 'torch')); "
        "print(out)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, _, usage = done.stdout.partition("\n")
    assert loaded == "['bench.cli']"
    for name in [*cli.HARNESSES, "gpu-proof"]:
        assert f"  {name} " in usage


def test_an_argparse_harness_gets_its_arguments_unparsed() -> None:
    result = CliRunner().invoke(cli.main, ["plots", "--help"])
    assert result.exit_code == 0
    assert "usage: mesh-bench plots" in result.output
    assert "report" in result.output


def test_an_unknown_command_name_is_refused_as_one(http_recorded: list) -> None:
    result = CliRunner().invoke(cli.main, ["sok", "--minutes", "1"])
    assert result.exit_code == 2
    assert "No such command 'sok'" in result.output
    assert http_recorded == []


def test_every_named_harness_resolves_to_a_command() -> None:
    ctx = click.Context(cli.main)
    for name in cli.main.list_commands(ctx):
        assert isinstance(cli.main.get_command(ctx, name), click.Command), name


def test_the_gpu_proof_script_is_where_the_command_runs_it() -> None:
    assert cli.GPU_PROOF.is_file()
    assert cli.GPU_PROOF.read_text().startswith("#!/usr/bin/env bash")


def test_no_bench_module_imports_the_tests() -> None:
    offenders = []
    for path in BENCH.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "tests"]
        if "tests/gpu" in path.read_text() and "sys.path" in path.read_text():
            offenders.append(f"{path.name}: sys.path to tests/gpu")
    assert offenders == []


def test_every_command_the_readme_and_performance_page_run_exists() -> None:
    import re

    ctx = click.Context(cli.main)
    known = set(cli.main.list_commands(ctx))
    pages = [BENCH / "README.md", BENCH.parent / "docs" / "performance.md"]
    # Commands as written: at the start of a line (a code block) or of inline code.
    command = re.compile(r"(?:^|`)mesh-bench ([a-z][a-z-]*)", re.MULTILINE)
    used = {m for page in pages for m in command.findall(page.read_text())}
    assert {"soak", "fuzz", "gpu-engine", "models", "rerank"} <= used
    assert used <= known, used - known

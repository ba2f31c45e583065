"""``mesh-launch``'s options, declared once (launch/options.py): the config file round-trips
every key, a flag beats its variable, which beats the file; ``--help`` reads by role; a flag of
another role is refused; the children of ``--role all`` get their argv from the options."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from launch import config_file
from launch.cli import main, parse
from launch.options import GROUPS, Declared, LaunchArgs, declared

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No EMBEDMESH_* of the caller's; what a config file exports is undone after the test."""
    for name in list(os.environ):
        if name.startswith("EMBEDMESH_"):
            monkeypatch.delenv(name)
    for option in declared():
        monkeypatch.setenv(option.env, "")
        monkeypatch.delenv(option.env)


def _sample(option: Declared, tmp: Path) -> Any:
    """A value of ``option``'s type that is not its default."""
    kind, default = option.spec.type, option.default
    if option.spec.multiple:
        return ("tcp://10.0.0.1:5555", "ipc:///tmp/other")
    if isinstance(kind, click.Path):
        path = tmp / option.name
        if kind.dir_okay and not kind.file_okay:
            path.mkdir(exist_ok=True)
        else:
            path.write_text("line\n")
        return path if kind.type is Path else str(path)
    if isinstance(kind, click.Choice):
        return next(c for c in kind.choices if c != default)
    if kind is None or kind is click.BOOL:
        return True if default is None else not default
    if isinstance(kind, click.types.IntParamType):  # IntRange too: within each range declared
        return max(getattr(kind, "min", None) or 0, default or 0) + 1
    if isinstance(kind, click.types.FloatParamType):
        return (default or 0) + 2.5
    return "given"


def _every_key_set(tmp: Path) -> LaunchArgs:
    values = {o.name: _sample(o, tmp) for o in config_file.configurable() if not o.spec.secret}
    return LaunchArgs().replaced(**values)


@pytest.mark.parametrize("role", ["broker", "worker", "ingress", "all"])
def test_the_printed_config_loads_back_to_the_same_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """Every key: each role reads back the values of the keys that apply to it, and keeps
    its defaults for the others (a file shared by roles)."""
    for args in (LaunchArgs(), _every_key_set(tmp_path)):
        path = tmp_path / "embedmesh.toml"
        path.write_text(config_file.render(args))
        loaded = parse(["--role", role, "--config", str(path)])[1]
        for option in config_file.configurable():
            want = args.value(option.name) if option.spec.applies_to(role) else option.default
            if option.spec.secret:
                want = None
            assert loaded.value(option.name) == want, option.name
        for option in declared():  # the knobs the file exported: a variable would now win
            monkeypatch.delenv(option.env, raising=False)


def test_a_config_key_of_another_role_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "shared.toml"
    path.write_text(f"[worker]\nmodel = '{tmp_path}/only-on-the-gpu-hosts'\n")
    assert parse(["--role", "broker", "--config", str(path)])[1].worker.model is None
    result = CliRunner().invoke(main, ["--role", "worker", "--config", str(path), "--print-config"])
    assert result.exit_code == 2 and "only-on-the-gpu-hosts" in result.output


def test_the_printed_config_names_every_key_its_variable_and_default() -> None:
    text = config_file.render(LaunchArgs())
    for option in config_file.configurable():
        assert f"{option.name} =" in text, option.name
        assert f"# {option.env}" in text
        assert option.env == (option.spec.env or "EMBEDMESH_" + option.name.upper())
    assert "reuse_port" not in text, "set by the launcher on its children only"


def test_the_api_key_is_never_printed(tmp_path: Path) -> None:
    text = config_file.render(LaunchArgs().replaced(api_key="s3cret"))
    assert "s3cret" not in text and '# api_key = "..."' in text


def test_a_flag_beats_its_variable_which_beats_the_file_which_beats_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[ingress]\nhttp_port = 9001\nmax_inputs = 7\n[link]\nlog_level = 'DEBUG'\n")
    args = parse(["--config", str(path)])[1]
    assert (args.ingress.http_port, args.ingress.max_inputs, args.link.log_level) == (
        9001, 7, "DEBUG",
    )  # fmt: skip
    assert args.ingress.http_host == "127.0.0.1", "a key not in the file keeps its default"
    monkeypatch.setenv("EMBEDMESH_HTTP_PORT", "9002")
    assert parse(["--config", str(path)])[1].ingress.http_port == 9002
    args = parse(["--config", str(path), "--http-port", "9003"])[1]
    assert (args.ingress.http_port, args.ingress.max_inputs) == (9003, 7)
    monkeypatch.setenv("EMBEDMESH_CONFIG", str(path))
    assert parse([])[1].ingress.max_inputs == 7, "EMBEDMESH_CONFIG names the file too"


def test_an_expert_knob_comes_from_its_variable_else_the_file_and_reaches_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[ingress]\nbulk_nice = 4\nbulk_sched = 'nice'\n[worker]\nlive_gate_ms = 0\n")
    assert parse([])[1].ingress.bulk_nice == 10
    args = parse(["--config", str(path)])[1]
    assert (args.ingress.bulk_nice, args.ingress.bulk_sched, args.worker.live_gate_ms) == (
        4, "nice", 0.0,
    )  # fmt: skip
    # The modules that read these knobs (and the children of --role all) find the file's value.
    assert os.environ["EMBEDMESH_BULK_NICE"] == "4"
    assert float(os.environ["EMBEDMESH_LIVE_GATE_MS"]) == 0
    from launch.supervisor import child_env

    assert child_env(args, "ingress-0", None)["EMBEDMESH_BULK_NICE"] == "4"
    assert float(child_env(args, "worker-0", None)["EMBEDMESH_LIVE_GATE_MS"]) == 0
    monkeypatch.setenv("EMBEDMESH_BULK_NICE", "2")
    assert parse(["--config", str(path)])[1].ingress.bulk_nice == 2
    assert os.environ["EMBEDMESH_BULK_NICE"] == "2", "a variable is never overwritten"
    with pytest.raises(click.NoSuchOption):
        parse(["--bulk-nice", "3"])  # a knob, not a flag


def test_the_knobs_defaults_are_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    from mesh.client.tokenize import bulk_nice_from_env, bulk_sched_idle_from_env
    from mesh.worker.live_gate import live_gate_ms_from_env
    from mesh.worker.server import switch_interval_s

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # bulk_nice_from_env may set it
    args = parse([])[1]
    assert args.ingress.bulk_nice == bulk_nice_from_env()
    assert (args.ingress.bulk_sched == "idle") is bulk_sched_idle_from_env()
    assert args.worker.live_gate_ms == live_gate_ms_from_env()
    assert args.worker.worker_switch_us / 1e6 == switch_interval_s()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[nowhere]\nx = 1\n", "[nowhere] is not a section"),
        ("[ingress]\nhttp_prot = 1\n", "has no key 'http_prot'"),
        ("[ingress]\nhttp_port = 'many'\n", "[ingress] http_port"),
        ("[ingress]\ningress_procs = 0\n", "[ingress] ingress_procs"),
        ("[ingress]\nreuse_port = true\n", "has no key 'reuse_port'"),
        ("[ingress\n", "Expected"),
    ],
)
def test_a_bad_config_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, text: str, error: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["--config", str(path), "--print-config"])
    assert result.exit_code == 2 and error in result.output, result.output


def test_help_reads_by_role_and_states_the_variables_and_the_config_file() -> None:
    text = CliRunner().invoke(main, ["--help"], terminal_width=100).output
    titles = [text.index(f"{title}:") for title in GROUPS.values()]
    assert titles == sorted(titles), "common, ingress, broker, worker, GPU, whole mesh"
    assert "EMBEDMESH_HTTP_PORT" in text and "--config" in text and "--print-config" in text
    assert "docs/config.md" in text
    for hidden in ("--live-window", "--heartbeat-interval", "--reuse-port", "--test-hang-after"):
        assert hidden not in text, hidden
    for group in GROUPS.values():
        section = text[text.index(f"{group}:") :].split("\n\n")[0]
        assert section.count("\n  --") <= 9, f"{group} is not short"


def test_the_test_hook_is_not_a_flag() -> None:
    result = CliRunner().invoke(main, ["--role", "worker", "--test-hang-after", "0"])
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.parametrize(
    ("argv", "flag", "roles"),
    [
        (["--role", "broker", "--http-port", "9000"], "--http-port", "ingress, all"),
        (["--role", "worker", "--frontend", "tcp://127.0.0.1:1"], "--frontend", "broker, all"),
        (["--role", "ingress", "--workers", "2"], "--workers", "all"),
        (["--role", "all", "--broker", "tcp://127.0.0.1:1"], "--broker", "worker, ingress"),
        (["--role", "broker", "--gpu", "0"], "--gpu", "worker, all"),
    ],
)
def test_a_flag_of_another_role_is_refused_by_name(argv: list[str], flag: str, roles: str) -> None:
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2
    assert f"{flag} does not apply to --role {argv[1]}; it is an option of --role {roles}" in (
        result.output
    )


def test_variables_and_config_keys_of_other_roles_are_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shared.toml"
    path.write_text("[ingress]\nhttp_port = 9001\n[worker]\nthreads = 2\n")
    monkeypatch.setenv("EMBEDMESH_WORKERS", "3")
    role, args = parse(["--role", "broker", "--config", str(path)])
    assert role == "broker" and args.ingress.http_port == 8000, "not the broker's: not read"
    assert args.supervisor.workers == 3, "a variable of another role is no error"
    assert parse(["--role", "ingress", "--config", str(path)])[1].ingress.http_port == 9001


def test_each_childs_argv_gives_it_the_options_of_its_role(tmp_path: Path) -> None:
    from launch.supervisor import role_commands

    args = _every_key_set(tmp_path).replaced(
        workers=2, ingress_procs=2, device="cpu", gpu=None, no_compile=False
    )
    commands = role_commands(args, "ipc:///t/f", "ipc:///t/b")
    assert list(commands) == ["broker", "worker-0", "worker-1", "ingress-0", "ingress-1"]
    children = {name: parse(argv) for name, argv in commands.items()}
    role, broker = children["broker"]
    assert role == "broker" and (broker.broker.frontend, broker.broker.backend) == (
        "ipc:///t/f", "ipc:///t/b",
    )  # fmt: skip
    assert _flags_of(broker.broker) == _flags_of(args.broker, frontend="ipc:///t/f",
        backend="ipc:///t/b")  # fmt: skip
    role, worker = children["worker-1"]
    assert role == "worker" and worker.link.broker_endpoints == ("ipc:///t/b",)
    assert _flags_of(worker.worker) == _flags_of(args.worker)
    role, ingress = children["ingress-1"]
    assert role == "ingress" and ingress.link.broker_endpoints == ("ipc:///t/f",)
    assert (ingress.ingress.ingress_procs, ingress.ingress.reuse_port) == (1, True)
    assert _flags_of(ingress.ingress, api_key=None, api_key_file=None) == _flags_of(
        args.ingress,
        api_key=None,
        api_key_file=None,
        ingress_procs=1,
        reuse_port=True,
        ingress_slot=1,
    )
    for _, child in children.values():
        assert (child.link.log_level, child.link.heartbeat_interval) == (
            args.link.log_level, args.link.heartbeat_interval,
        )  # fmt: skip


def _flags_of(section: Any, **but: Any) -> dict[str, Any]:
    """The values of a section's flag options (knobs travel by environment), ``but`` these."""
    names = {o.name for o in declared() if o.spec.flag}
    values = {k: v for k, v in vars(section).items() if k in names}
    return {**values, **but}


def test_role_all_binds_the_broker_where_told() -> None:
    from launch.supervisor import _endpoints, role_commands

    args = parse(["--frontend", "tcp://127.0.0.1:18555", "--backend", "tcp://127.0.0.1:18556"])[1]
    assert _endpoints(Path("/t"), args) == ("tcp://127.0.0.1:18555", "tcp://127.0.0.1:18556")
    private = _endpoints(Path("/t"), parse([])[1])
    assert all(e.startswith(("ipc:///t/", "tcp://127.0.0.1:")) for e in private), private
    commands = role_commands(args, *_endpoints(Path("/t"), args))
    ingress = commands.get("ingress") or commands["ingress-0"]
    assert ingress[ingress.index("--broker") + 1] == "tcp://127.0.0.1:18555"


def _taken() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize(
    "argv",
    [
        ["--role", "broker", "--frontend", "tcp://127.0.0.1:{port}"],
        ["--role", "broker", "--frontend", "ipc:///tmp/x", "--backend", "tcp://127.0.0.1:{port}"],
        ["--role", "ingress", "--http-port", "{port}", "--ingress-procs", "1"],
    ],
)
def test_a_port_in_use_fails_at_once_in_one_line(argv: list[str]) -> None:
    with _taken() as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, [a.format(port=port) for a in argv])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "another server" in lines[0]


def test_the_configuration_reference_is_current() -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == config_file.reference(), "run: python -m launch.config_file > docs/config.md"


def test_the_references_example_file_serves_the_broker_and_the_ingress(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    example = tmp_path / "mesh.toml"
    example.write_text(page.split("```toml\n")[1].split("```")[0])
    broker = parse(["--role", "broker", "--config", str(example)])[1]
    assert (broker.broker.frontend, broker.link.curve_dir) == (
        "tcp://10.0.0.5:5555", Path("/etc/embedmesh/keys"),
    )  # fmt: skip
    ingress = parse(["--role", "ingress", "--config", str(example)])[1]
    assert (ingress.ingress.http_host, ingress.ingress.ingress_procs) == ("0.0.0.0", 4)
    with pytest.raises(config_file.ConfigError, match="bge-base-en-v1.5"):
        config_file.load(example, "worker")  # the model lives on the worker hosts only


def test_every_variable_the_code_reads_is_a_declared_setting() -> None:
    """A setting read from EMBEDMESH_* anywhere in the package is declared in launch/options.py
    (so it has a config key, a line in docs/config.md and reaches the children of --role
    all); the rest are the launcher's own: its top options, its child marker, the test hook.
    mesh/embed_cli is another command (mesh-embed) with variables of its own."""
    import re

    launcher = {"EMBEDMESH_CONFIG", "EMBEDMESH_ROLE", "EMBEDMESH_GEN_KEYS"}
    launcher |= {"EMBEDMESH_PRINT_CONFIG", "EMBEDMESH_SUPERVISOR_PID", "EMBEDMESH_TEST_HANG_AFTER"}
    named = {
        name
        for folder in ("mesh", "launch", "proto_msgs")
        for path in (ROOT / folder).rglob("*.py")
        if "embed_cli" not in path.parts
        for name in re.findall(r"EMBEDMESH_[A-Z][A-Z_]*[A-Z]", path.read_text())
    }
    assert "EMBEDMESH_WINDOW_MASK" in named and "EMBEDMESH_BULK_SCHED" in named
    assert named - launcher - {o.env for o in declared()} == set()

"""``mesh-launch --role ingress`` flags become the IngressConfig the server runs with."""

from __future__ import annotations

from launch.cli import parse
from launch.ingress_role import ingress_config
from launch.options import LaunchArgs
from mesh.config import Liveness


def params(*args: str) -> LaunchArgs:
    return parse(["--role", "ingress", *args])[1]


def test_defaults_give_the_documented_ingress() -> None:
    cfg = ingress_config(params(), Liveness())
    assert cfg.brokers == ["tcp://127.0.0.1:5555"]
    assert (cfg.http_host, cfg.http_port, cfg.api_key, cfg.auto_truncate) == (
        "127.0.0.1", 8000, None, False,
    )  # fmt: skip
    assert (cfg.max_body_bytes, cfg.max_inputs) == (16 << 20, 2048)


def test_every_ingress_flag_reaches_the_config() -> None:
    liveness = Liveness(0.5, 4)
    cfg = ingress_config(
        params(
            "--broker", "ipc:///tmp/a", "--broker", "tcp://10.0.0.2:5555",
            "--http-host", "0.0.0.0", "--http-port", "9000", "--api-key", "k",
            "--auto-truncate", "--max-body-bytes", "1000", "--max-inputs", "7",
            "--tokenizer-threads", "2", "--request-timeout", "3.5",
        ),
        liveness,
    )  # fmt: skip
    assert cfg.brokers == ["ipc:///tmp/a", "tcp://10.0.0.2:5555"]
    assert (cfg.http_host, cfg.http_port, cfg.api_key, cfg.auto_truncate) == (
        "0.0.0.0", 9000, "k", True,
    )  # fmt: skip
    assert (cfg.max_body_bytes, cfg.max_inputs, cfg.tokenizer_threads) == (1000, 7, 2)
    assert cfg.request_timeout_s == 3.5 and cfg.liveness is liveness


# ---- several ingress processes, and the API key kept out of argv -----------------------------


def test_default_ingress_procs_is_half_the_cores_and_at_least_one(monkeypatch) -> None:
    from launch import options

    for cores, procs in [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8)]:
        monkeypatch.setattr(options.os, "sched_getaffinity", lambda _, n=cores: set(range(n)))
        assert options.default_ingress_procs() == procs, cores
        assert options.ingress_procs(params()) == procs
    assert options.ingress_procs(params("--ingress-procs", "3")) == 3


def test_ingress_procs_reads_its_env_var_and_refuses_zero(monkeypatch) -> None:
    import click
    import pytest

    from launch.options import ingress_procs

    monkeypatch.setenv("EMBEDMESH_INGRESS_PROCS", "5")
    assert ingress_procs(params()) == 5
    assert ingress_procs(params("--ingress-procs", "2")) == 2, "a flag wins over the env var"
    with pytest.raises(click.BadParameter):
        params("--ingress-procs", "0")


def test_reuse_port_is_off_for_a_lone_ingress_and_reaches_the_config() -> None:
    assert ingress_config(params(), Liveness()).reuse_port is False
    assert ingress_config(params("--reuse-port"), Liveness()).reuse_port is True


def test_the_api_key_can_come_from_a_file_but_not_from_both(tmp_path, monkeypatch) -> None:
    import click
    import pytest

    from launch.ingress_role import api_key

    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    assert ingress_config(params("--api-key-file", str(key_file)), Liveness()).api_key == "s3cret"
    with pytest.raises(click.UsageError, match="not both"):
        api_key(params("--api-key", "x", "--api-key-file", str(key_file)).ingress)
    monkeypatch.setenv("EMBEDMESH_API_KEY", "from-env")
    assert api_key(params().ingress) == "from-env"
    key_file.write_text("\n")
    monkeypatch.delenv("EMBEDMESH_API_KEY")
    with pytest.raises(click.BadParameter, match="empty"):
        api_key(params("--api-key-file", str(key_file)).ingress)


def _all_opts(*args: str) -> LaunchArgs:
    return parse(["--role", "all", *args])[1]


def test_several_ingress_children_share_the_port_and_none_can_become_a_parent() -> None:
    from launch.supervisor import ingress_commands, role_commands

    cmds = role_commands(_all_opts("--ingress-procs", "2"), "ipc:///t/front", "ipc:///t/back")
    assert list(cmds) == ["broker", "worker-0", "ingress-0", "ingress-1"]
    for name in ("ingress-0", "ingress-1"):
        args = cmds[name]
        assert "--reuse-port" in args and args[args.index("--ingress-procs") + 1] == "1"
        assert args[args.index("--broker") + 1] == "ipc:///t/front"
    alone = ingress_commands(_all_opts("--ingress-procs", "1"), ["tcp://a:1", "tcp://b:2"])
    assert list(alone) == ["ingress"] and "--reuse-port" not in alone["ingress"]
    assert [a for a in alone["ingress"] if a.startswith("tcp://")] == ["tcp://a:1", "tcp://b:2"]


def test_children_get_the_api_key_by_environment_and_only_the_ingresses(
    tmp_path, monkeypatch
) -> None:
    from launch.supervisor import child_env, role_commands

    key_file = tmp_path / "key"
    key_file.write_text("file-key\n")
    # Inherited key settings must not reach any child as they are (a file and a key would
    # conflict in the child; workers and the broker have no use for the key).
    monkeypatch.setenv("EMBEDMESH_API_KEY_FILE", str(key_file))
    opts = _all_opts("--ingress-procs", "2")
    assert opts.ingress.api_key_file == key_file
    cmds = role_commands(opts, "ipc:///t/front", "ipc:///t/back")
    assert not any("file-key" in " ".join(args) for args in cmds.values())
    metrics = tmp_path / "metrics"
    for name in cmds:
        env = child_env(opts, name, metrics)
        assert "EMBEDMESH_API_KEY_FILE" not in env
        if name.startswith("ingress"):
            assert env["EMBEDMESH_API_KEY"] == "file-key"
            assert env["PROMETHEUS_MULTIPROC_DIR"] == str(metrics)
        else:
            assert "EMBEDMESH_API_KEY" not in env and "PROMETHEUS_MULTIPROC_DIR" not in env


def test_the_launcher_refuses_port_zero_and_a_port_in_use() -> None:
    import socket

    import pytest

    from launch.supervisor import RoleFailed, check_port_free

    with pytest.raises(RoleFailed, match="--http-port 0"):
        check_port_free("127.0.0.1", 0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RoleFailed, match="another server"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again once its listener closed


def test_drain_grace_and_body_timeout_reach_the_config() -> None:
    cfg = ingress_config(params(), Liveness())
    assert (cfg.drain_grace_s, cfg.body_timeout_s) == (30.0, 30.0)
    cfg = ingress_config(params("--drain-grace", "5", "--body-timeout", "2.5"), Liveness())
    assert (cfg.drain_grace_s, cfg.body_timeout_s) == (5.0, 2.5)


def test_connection_limits_reach_the_config_and_the_ingresses_of_role_all() -> None:
    from launch.supervisor import role_commands

    limits = ingress_config(params(), Liveness()).connection_limits
    assert (limits.header_timeout_s, limits.idle_timeout_s, limits.max_connections) == (
        10.0, 75.0, 4096,
    )  # fmt: skip
    given = ("--header-timeout", "2", "--idle-timeout", "30", "--max-connections", "64")
    limits = ingress_config(params(*given), Liveness()).connection_limits
    assert (limits.header_timeout_s, limits.idle_timeout_s, limits.max_connections) == (
        2.0, 30.0, 64,
    )  # fmt: skip
    cmds = role_commands(_all_opts(*given), "ipc:///t/front", "ipc:///t/back")
    args = cmds["ingress"] if "ingress" in cmds else cmds["ingress-0"]
    assert args[args.index("--max-connections") + 1] == "64"
    assert args[args.index("--header-timeout") + 1] == "2.0"


def test_tei_model_reaches_the_config_and_the_ingresses_of_role_all() -> None:
    from launch.supervisor import role_commands

    assert ingress_config(params(), Liveness()).tei_model is None
    assert ingress_config(params("--tei-model", "bge"), Liveness()).tei_model == "bge"
    cmds = role_commands(_all_opts("--tei-model", "bge"), "ipc:///t/front", "ipc:///t/back")
    args = cmds["ingress"] if "ingress" in cmds else cmds["ingress-0"]
    assert args[args.index("--tei-model") + 1] == "bge"

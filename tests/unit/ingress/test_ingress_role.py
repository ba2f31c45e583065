"""``mesh-launch --role ingress`` flags become the IngressConfig the server runs with."""

from __future__ import annotations

from launch.cli import main
from launch.ingress_role import ingress_config
from mesh.config import Liveness


def params(*args: str) -> dict:
    return main.make_context("mesh-launch", ["--role", "ingress", *args]).params


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

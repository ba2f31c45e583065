"""``mesh-launch``'s live-first knobs: ``--live-lane`` (on for CUDA workers by default, with one
more credit for the lane) and ``--ingress-nice`` (the ingress processes run at a lower OS
priority than the broker and workers), each reaching the role that uses it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import launch.roles as roles
from launch.cli import parse
from launch.options import LaunchArgs, WorkerArgs
from mesh.config import WORKER_CREDITS, Liveness
from mesh.worker.budget import CurvePoint


def _all_opts(*args: str) -> LaunchArgs:
    return parse(["--role", "all", *args])[1]


@pytest.mark.parametrize(
    ("choice", "device", "on"),
    [("auto", "cuda", True), ("auto", "cpu", False), ("on", "cpu", True), ("off", "cuda", False)],
)
def test_the_live_lane_is_on_for_cuda_workers_unless_told(choice: str, device: str, on: bool):
    assert roles.live_lane_on(choice, device) is on


def test_one_credit_turns_auto_off_but_not_an_explicit_on() -> None:
    assert roles.live_lane_on("auto", "cuda", credits=1) is False
    assert roles.live_lane_on("auto", "cuda", credits=2) is True
    # "on" stays on: the worker then refuses to start, saying why (two credits at least).
    assert roles.live_lane_on("on", "cuda", credits=1) is True


def test_flashinfers_programmatic_launch_follows_the_environment(monkeypatch) -> None:
    from mesh.worker.engine.kernels.flashinfer_attention import pdl_from_env

    monkeypatch.delenv("EMBEDMESH_FLASHINFER_PDL", raising=False)
    assert pdl_from_env() is None
    monkeypatch.setenv("EMBEDMESH_FLASHINFER_PDL", "0")
    assert pdl_from_env() is False
    monkeypatch.setenv("EMBEDMESH_FLASHINFER_PDL", "1")
    assert pdl_from_env() is True


def test_flashinfer_without_the_environment_calls_run_as_before_pdl_existed() -> None:
    # pyproject allows flashinfer>=0.2; run() took no enable_pdl before 0.2.7.
    from mesh.worker.engine.kernels.flashinfer_attention import FlashInferRagged

    class OldWrapper:
        def run(self, q, k, v, *args, out=None, lse=None):  # noqa: ANN001, ANN002, ANN202
            return "ran"

    backend = object.__new__(FlashInferRagged)
    backend.wrapper, backend._key_rows, backend._pdl = OldWrapper(), None, None
    assert backend.run(None, None, None) == "ran"  # type: ignore[arg-type]


def test_an_unknown_live_lane_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, on or off"):
        roles.live_lane_on("maybe", "cuda")


class _Captured(Exception):
    pass


class _Engine:
    def __init__(self, device: str, max_batch_tokens: int | None = None) -> None:
        self.device = torch.device(device)
        self.max_batch_tokens = max_batch_tokens or 16384
        self.dtype = torch.float32
        self.vocab_size = 30522
        self.hidden_size = 384
        self.card = _Card()


class _Card:
    name, aliases, dims, max_input_tokens = "m", (), 384, 512
    pooling, normalize, tokenizer_digest, tokenizer_json = "mean", True, "0" * 64, b"{}"
    prompts: dict[str, str] = {}
    default_prompt_name, include_prompt, task, labels = None, True, "embed", ()
    activation, dense, lexical, multivector, colbert = None, (), False, None, None


def _worker_options(monkeypatch: pytest.MonkeyPatch, device: str, **cfg: Any) -> Any:
    """The WorkerOptions ``run_worker`` builds for ``cfg`` on a fake engine on ``device``."""
    seen: dict[str, Any] = {}

    def fake_server(ctx, engine, info, tokenizer, broker, options, liveness, connect):  # noqa: ANN001
        seen["options"] = options
        raise _Captured

    monkeypatch.setattr(
        "mesh.worker.engine.engine.Engine.load",
        lambda *a, **k: _Engine(device, k["max_batch_tokens"]),
    )
    monkeypatch.setattr("mesh.worker.server.WorkerServer", fake_server)
    # The sweep of --max-batch-tokens auto (a CPU's default), on a fake engine: a fixed curve.
    monkeypatch.setattr("mesh.worker.budget.auto_budget", lambda engine: CurvePoint(2048, 6e3, 0.3))
    config = WorkerArgs(**{"device": device, "max_batch_requests": 64, **cfg})
    with pytest.raises(_Captured):
        roles.run_worker(config, ("ipc:///t/b",), Liveness(), roles.Security())
    return seen["options"]


@pytest.mark.parametrize(
    ("device", "credits", "want"),
    [
        ("cuda", None, (WORKER_CREDITS + 1, True)),  # the lane keeps one more credit
        ("cpu", None, (WORKER_CREDITS, False)),
        ("cuda", 5, (5, True)),  # an explicit --credits is what the worker grants
        ("cuda", 1, (1, False)),  # one credit leaves "auto" no lane: it runs without one
    ],
)
def test_a_worker_with_a_live_lane_grants_one_more_credit_by_default(
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    credits: int | None,
    want: tuple[int, bool],
) -> None:
    options = _worker_options(monkeypatch, device, credits=credits)
    assert (options.credits, options.live_lane) == want


@pytest.mark.parametrize(
    ("device", "budget", "want"),
    [
        ("cpu", None, (2048, 6e3)),  # auto by default on a CPU: the sweep's choice and rate
        ("cuda", "auto", (2048, 6e3)),  # on a GPU when asked
        ("cuda", None, (16384, 0.0)),  # the GPU default: the engine's, nothing measured
        ("cpu", 4096, (4096, 0.0)),  # a number is used as given
    ],
)
def test_the_worker_advertises_the_budget_auto_chose_with_its_rate(
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    budget: int | str | None,
    want: tuple[int, float],
) -> None:
    options = _worker_options(monkeypatch, device, max_batch_tokens=budget)
    assert (options.max_batch_tokens, options.tokens_per_s) == want


def test_live_lane_and_ingress_nice_reach_only_the_roles_that_use_them() -> None:
    from launch.supervisor import role_commands

    cmds = role_commands(
        _all_opts("--ingress-procs", "2", "--live-lane", "off", "--ingress-nice", "5"),
        "ipc:///t/front",
        "ipc:///t/back",
    )
    worker, ingresses = cmds["worker-0"], [cmds["ingress-0"], cmds["ingress-1"]]
    assert worker[worker.index("--live-lane") + 1] == "off"
    assert "--credits" not in worker  # the worker picks its default, lane or not
    assert "--ingress-nice" not in worker and "--ingress-nice" not in cmds["broker"]
    for args in ingresses:
        assert args[args.index("--ingress-nice") + 1] == "5" and "--live-lane" not in args


def test_the_ingress_lowers_its_own_priority_before_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from launch.ingress_role import run_ingress_role

    order: list[str] = []
    monkeypatch.setattr(os, "nice", lambda n: order.append(f"nice {n}"))

    async def fake_serve(cfg, stop, connect) -> None:  # noqa: ANN001
        order.append("serve")

    monkeypatch.setattr("mesh.ingress.server.serve", fake_serve)
    port = ["--http-port", "0"]  # no port to probe: serve is faked
    nicer = parse(["--role", "ingress", *port, "--ingress-nice", "7"])[1]
    assert run_ingress_role(nicer, Liveness(), roles.Security()) == 0
    assert order == ["nice 7", "serve"]
    order.clear()
    plain = parse(["--role", "ingress", *port])[1]
    assert run_ingress_role(plain, Liveness(), roles.Security()) == 0
    assert order == ["serve"]  # the default: the same priority as the rest of the mesh


def test_a_lanes_capture_stream_is_never_the_bulk_runners(monkeypatch) -> None:
    """torch hands CUDA streams out of a pool in turn: a lane runner whose capture stream came
    round to the bulk runner's draws again (their graphs would share a cuBLAS workspace)."""
    from dataclasses import replace

    import mesh.worker.engine.gpu as gpu
    from mesh.worker.engine.card import default_model_path
    from mesh.worker.engine.engine import Engine

    class Runner:  # what Engine.live_lane reads of a GpuRunner
        def __init__(self, *args: object) -> None:
            self.capture_stream, self.output_heads, self.graphs_on = "s1", object(), True
            self.lazy_capture = True

    draws = iter(["s1", "s2", "s3"])  # the pool comes round to s1 once more, then s2
    monkeypatch.setattr(gpu, "GpuRunner", Runner)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: next(draws))
    engine = replace(Engine.load(str(default_model_path()), device="cpu"), runner=Runner())
    lane = engine.live_lane(1024)
    assert lane.runner.capture_stream == "s2" and not lane.runner.lazy_capture

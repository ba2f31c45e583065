"""Process bodies of each role: build the sockets, run the loop, stop cleanly on a signal."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from launch.options import (
    DEFAULT_BACKEND,
    DEFAULT_FRONTEND,
    BrokerArgs,
    LinkArgs,
    WorkerArgs,
)
from mesh.config import WORKER_CREDITS, WORKER_WATCHDOG_S, Liveness

if TYPE_CHECKING:
    from mesh.worker.engine.engine import Engine
    from proto_msgs import ModelInfo

log = logging.getLogger("embedmesh.launch")
TEST_HANG_AFTER_ENV = "EMBEDMESH_TEST_HANG_AFTER"


@dataclass
class Security:
    """How sockets are secured: CURVE keys from a directory, or plain on loopback."""

    curve_dir: Path | None = None
    insecure: bool = False


def _on_signals(stop: Callable[[], None]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop())
    # Diagnostics: `kill -USR1 PID` prints every thread's stack to the role's log (stderr),
    # for a process that hangs, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _server_binder(security: Security, ctx: zmq.Context, name: str):  # noqa: ANN202
    from mesh import transport

    keys = transport.load_server_keys(security.curve_dir, name) if security.curve_dir else None
    auth = None
    if keys is not None:
        auth = transport.CurveAuth(ctx, keys.allowed_clients_dir or security.curve_dir)
        auth.start()

    def bind(sock: zmq.Socket, endpoint: str) -> None:
        transport.set_common_options(sock, endpoint)
        transport.secure_bind(sock, endpoint, keys, security.insecure)

    return bind, auth


def client_connector(security: Security, name: str) -> Callable[[zmq.Socket, str], None]:
    from mesh import transport

    keys = transport.load_client_keys(security.curve_dir, name) if security.curve_dir else None

    def connect(sock: zmq.Socket, endpoint: str) -> None:
        transport.set_common_options(sock, endpoint)
        transport.secure_connect(sock, endpoint, keys)

    return connect


def liveness_of(link: LinkArgs) -> Liveness:
    return Liveness(link.heartbeat_interval, link.heartbeat_liveness)


def security_of(link: LinkArgs) -> Security:
    return Security(link.curve_dir, link.insecure)


def run_broker(args: BrokerArgs, liveness: Liveness, security: Security) -> None:
    from launch.ports import check_endpoint_free
    from mesh.broker.server import Broker, BrokerOptions

    frontend = args.frontend or DEFAULT_FRONTEND
    backend = args.backend or DEFAULT_BACKEND
    options = BrokerOptions(
        liveness=liveness,
        max_queued_tokens=args.max_queued_tokens,
        batch_timeout_s=args.batch_timeout,
        hang_s=args.hang_timeout,
        max_attempts=args.max_attempts,
        aging_s=args.aging,
        live_bulk_batches=args.live_bulk_batches,
        live_bulk_ms=args.live_bulk_ms,
        live_window_s=args.live_window,
        orphan_grace_s=args.orphan_grace,
        forget_model_s=args.forget_model_after,
        cpu_bulk_ms=args.cpu_bulk_ms,
    )
    check_endpoint_free(frontend, "--frontend")
    check_endpoint_free(backend, "--backend")
    ctx = zmq.Context()
    bind, auth = _server_binder(security, ctx, "broker")
    front = ctx.socket(zmq.ROUTER)
    back = ctx.socket(zmq.ROUTER)
    # A ROUTER drops replies to a vanished peer silently instead of blocking the loop.
    bind(front, frontend)
    bind(back, backend)
    broker = Broker(front, back, options)
    _on_signals(broker.stop)
    log.info("broker up: frontend %s, backend %s", frontend, backend)
    try:
        broker.run()
    finally:
        front.close(linger=0)
        back.close(linger=0)
        if auth is not None:
            auth.stop()
        ctx.term()
        log.info("broker stopped")


def hang_after_from_env() -> int | None:
    """Test hook: the compute loop hangs after this many batches (``EMBEDMESH_TEST_HANG_AFTER``,
    set by the tests; no flag, not in --help)."""
    raw = os.environ.get(TEST_HANG_AFTER_ENV, "").strip()
    return int(raw) if raw else None


def live_lane_on(choice: str, device_type: str, credits: int | None = None) -> bool:
    """``--live-lane``: "auto" is on for CUDA workers (on CPU two batches at once only share
    the same cores) unless ``--credits`` leaves it none (a lane keeps one credit and bulk
    needs another, and a worker asked for one credit ran before the lane existed)."""
    if choice not in ("auto", "on", "off"):
        raise ValueError(f"--live-lane must be auto, on or off, not {choice!r}")
    if choice == "auto" and device_type == "cuda" and credits is not None and credits < 2:
        log.warning("--credits %d leaves a live lane no credit of its own: it stays off", credits)
        return False
    return choice == "on" or (choice == "auto" and device_type == "cuda")


def model_info(engine: Engine) -> ModelInfo:
    """What the worker's READY tells the mesh about its model."""
    from proto_msgs import ModelInfo

    card = engine.card
    return ModelInfo(
        name=card.name,
        aliases=list(card.aliases),
        dims=card.dims,
        max_input_tokens=card.max_input_tokens,
        vocab_size=engine.vocab_size,
        pooling=card.pooling,
        normalize=card.normalize,
        tokenizer_digest=card.tokenizer_digest,
        prompts=dict(card.prompts),
        default_prompt_name=card.default_prompt_name,
        include_prompt=card.include_prompt,
        task=card.task,
        labels=list(card.labels),
        activation=card.activation,
        hidden_size=engine.hidden_size,
        has_dense=bool(card.dense),
        lexical=card.lexical,
        multivector_dims=card.multivector.out_features if card.multivector else 0,
        late_interaction=card.colbert.tokens if card.colbert else None,
        dtype=str(engine.dtype).removeprefix("torch."),
    )


def run_worker(
    cfg: WorkerArgs, brokers: tuple[str, ...], liveness: Liveness, security: Security
) -> None:
    """A worker of ``cfg`` on the first of ``brokers`` (the default backend when none)."""
    engine, tokens_per_s = load_engine(cfg)
    serve_worker(cfg, engine, brokers, liveness, security, tokens_per_s=tokens_per_s)


def load_engine(cfg: WorkerArgs) -> tuple[Engine, float]:
    """The engine ``cfg`` asks for, loaded (and its ``--buckets`` warmed), and the rate it
    measured: at the budget ``--max-batch-tokens auto`` chose, else on a probe batch (0.0
    when the probe could not run)."""
    import torch

    from mesh.worker.budget import auto_budget, budget_is_auto
    from mesh.worker.engine.card import default_model_path
    from mesh.worker.engine.engine import Engine
    from mesh.worker.probe import probe_rate

    dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
    model_dir = cfg.model or str(default_model_path())
    device = cfg.device_name
    kernels = "torch" if cfg.no_compile else cfg.kernels
    if kernels not in (None, "torch") and not device.startswith("cuda"):
        # As --help says: CPU always runs plain torch; a fleet-wide setting must not stop
        # the CPU workers of a mixed fleet.
        log.warning("--kernels %s applies to CUDA workers only; this one runs on CPU", kernels)
        kernels = None
    auto = budget_is_auto(cfg.max_batch_tokens, device)
    budget = None if auto or cfg.max_batch_tokens is None else int(cfg.max_batch_tokens)
    engine = Engine.load(
        model_dir,
        device=device,
        dtype=dtype,
        served_name=cfg.served_name,
        max_batch_tokens=budget,
        threads=cfg.threads,
        kernels=kernels,
        exact_gelu=cfg.exact_gelu,
    )
    if cfg.buckets:
        engine.warmup(cfg.buckets)
    if not auto:
        # Admission in time needs a rate before the first batch: a probe batch's.
        return engine, probe_rate(engine, engine.max_batch_tokens, engine.card.max_input_tokens)
    chosen = auto_budget(engine)
    engine.max_batch_tokens = chosen.tokens
    return engine, chosen.tokens_per_s


def serve_worker(
    cfg: WorkerArgs,
    engine: Engine,
    brokers: tuple[str, ...],
    liveness: Liveness,
    security: Security,
    *,
    tokens_per_s: float = 0.0,
) -> None:
    """Serve ``engine`` (an :class:`Engine`, or a stand-in with its ``card``, ``vocab_size``,
    ``hidden_size`` and ``dtype``: the bench's null engine) as a worker of ``cfg`` on the
    first of ``brokers``, until a signal stops it. ``tokens_per_s``: the engine's measured
    rate, announced in READY (0.0: not measured)."""
    from mesh.worker.server import WorkerOptions, WorkerServer

    broker = brokers[0] if brokers else DEFAULT_BACKEND
    device = cfg.device_name
    card = engine.card
    info = model_info(engine)
    live = live_lane_on(cfg.live_lane, engine.device.type, cfg.credits)
    options = WorkerOptions(
        name=f"{socket.gethostname()}:{device}",
        credits=cfg.credits if cfg.credits is not None else WORKER_CREDITS + live,
        live_lane=live,
        max_batch_tokens=engine.max_batch_tokens,
        max_batch_requests=cfg.max_batch_requests,
        device=device,
        test_hang_after=hang_after_from_env(),
        watchdog_s=WORKER_WATCHDOG_S if cfg.watchdog_s is None else cfg.watchdog_s,
        profile_out=cfg.profile_out,
        tokens_per_s=tokens_per_s,
    )
    ctx = zmq.Context()
    server = WorkerServer(
        ctx,
        engine,
        info,
        card.tokenizer_json,
        broker,
        options,
        liveness,
        connect=client_connector(security, "worker"),
    )
    _on_signals(server.stop)
    log.info("worker up: %s on %s, broker %s", card.name, device, broker)
    try:
        server.run()
    finally:
        ctx.destroy(linger=0)
        log.info("worker stopped")

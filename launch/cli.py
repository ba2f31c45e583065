"""``mesh-launch``: start one role of the mesh (or, with ``--role all``, a whole mesh).

Every flag has an ``EMBEDMESH_<FLAG>`` environment variable (``--http-port`` →
``EMBEDMESH_HTTP_PORT``); ``mesh-launch --help`` is the reference.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
import zmq

from launch.roles import Security, WorkerConfig, run_broker, run_worker
from launch.supervisor import RESTART_LIMIT, die_with_parent_from_env
from mesh import config
from mesh.config import Liveness
from mesh.ingress.config import BODY_TIMEOUT_S, DRAIN_GRACE_S
from mesh.transport import InsecureBindError

DEFAULT_FRONTEND = "tcp://127.0.0.1:5555"
DEFAULT_BACKEND = "tcp://127.0.0.1:5556"


@click.command(context_settings={"auto_envvar_prefix": "EMBEDMESH", "show_default": True})
@click.option(
    "--role",
    type=click.Choice(["broker", "worker", "ingress", "all"]),
    default="all",
    help="Which part of the mesh this process runs (all: a whole mesh on this host).",
)
# broker
@click.option(
    "--frontend", default=DEFAULT_FRONTEND, help="[broker] Endpoint ingresses connect to."
)
@click.option("--backend", default=DEFAULT_BACKEND, help="[broker] Endpoint workers connect to.")
@click.option(
    "--max-queued-tokens",
    type=int,
    default=config.MAX_QUEUED_TOKENS,
    help="[broker] Queued tokens per model before requests get OVERLOADED (429). Once a"
    " worker's rate is known, a request that would end past its timeout is refused too.",
)
@click.option(
    "--batch-timeout",
    type=float,
    default=config.BATCH_TIMEOUT_S,
    help="[broker] Seconds a batch may take before its worker counts as hung.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=config.MAX_ATTEMPTS,
    help="[broker] Dispatches of one input before it fails with WORKER_FAILED.",
)
@click.option(
    "--orphan-grace",
    type=click.FloatRange(min=0),
    show_default="one heartbeat expiry; with --role all, --request-timeout",
    help="[broker, all] Seconds the queued work of a model whose last worker left waits for "
    "a worker to come back before it fails with 503 (each request still ends at its own "
    "deadline). --role all restarts dead workers, so there it waits out the request timeout.",
)
@click.option(
    "--aging",
    type=float,
    default=config.AGING_S,
    help="[broker] Seconds after which waiting batch-lane work goes first.",
)
@click.option(
    "--live-window",
    type=click.FloatRange(min=0),
    default=config.LIVE_WINDOW_S,
    help="[broker] Seconds after an interactive request during which a model counts as "
    "serving live traffic (and --live-bulk-batches applies to its workers without a live "
    "lane).",
)
@click.option(
    "--live-bulk-batches",
    type=click.FloatRange(min=0, min_open=True),
    default=config.LIVE_BULK_BATCHES,
    help="[broker] While live traffic is about, the batch-lane tokens a worker without a live "
    "lane (a CPU worker, or --live-lane off) may hold, in its batch budgets: 1 = a query "
    "waits behind about one batch; the worker's --credits turns the cap off (bulk throughput "
    "first). A worker with a live lane is not capped: its queries run beside its bulk.",
)
@click.option(
    "--live-bulk-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=config.LIVE_BULK_MS,
    help="[broker] While live traffic is about, the batch-lane work a worker without a live "
    "lane may hold, in milliseconds of its compute (learned from its large batches): on a "
    "CPU, where one full batch takes over a second, this is what keeps a query's wait short.",
)
@click.option(
    "--hang-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=config.HANG_S,
    help="[broker] Seconds a worker holding batches may report no progress before it is "
    "buried as hung and its batches requeued.",
)
@click.option(
    "--forget-model-after",
    type=click.FloatRange(min=0, min_open=True),
    default=config.MODEL_FORGET_S,
    help="[broker] Seconds after its last worker left that a model is forgotten (404 "
    "instead of 503).",
)
# worker / ingress
@click.option(
    "--broker",
    "broker_endpoints",
    multiple=True,
    help="[worker] the broker backend (default tcp://127.0.0.1:5556); [ingress] broker "
    "frontend(s), repeatable (default tcp://127.0.0.1:5555).",
)
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False),
    help="[worker] Model directory in Hugging Face layout (default: the embedded "
    "all-MiniLM-L6-v2).",
)
@click.option(
    "--served-name", help="[worker] Name clients use for the model (default: from the directory)."
)
@click.option("--device", default="cpu", help="[worker] cpu, cuda or cuda:N.")
@click.option("--gpu", type=int, help="[worker] CUDA device index; same as --device cuda:N.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    help="[worker] Weights and activations (default fp32 on CPU, bf16/fp16 on GPU).",
)
@click.option(
    "--credits",
    type=int,
    help=f"[worker] Batches in flight at once (default {config.WORKER_CREDITS}: one running, "
    "one prefetched; one more with a live lane, which keeps it).",
)
@click.option(
    "--live-lane",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    help="[worker] Run small batches (live queries) beside bulk, on a high-priority CUDA "
    "stream with graphs of their own, keeping one credit for them, so a query does not wait "
    "behind the bulk the worker holds. auto: on for CUDA workers (unless --credits 1, "
    "which leaves it none), off on CPU.",
)
@click.option(
    "--max-batch-tokens",
    type=int,
    help="[worker] Token budget of one batch (default 8192 on CPU, more on GPU).",
)
@click.option(
    "--max-batch-requests",
    type=int,
    default=config.MAX_BATCH_REQUESTS,
    help="[worker] Sequences in one batch at most.",
)
@click.option(
    "--threads",
    type=int,
    help="[worker, all] torch intra-op threads of each worker (default: one per core; with "
    "--role all on CPU, the cores split evenly between the --workers).",
)
@click.option(
    "--warmup-buckets",
    default="",
    help="[worker] CUDA: token buckets whose graphs are captured at start, comma-separated "
    "(e.g. 16,64,256,1024); others are captured lazily as traffic reaches them.",
)
@click.option(
    "--kernels",
    type=click.Choice(["torch", "compile", "fused"]),
    help="[worker] CUDA: how the per-layer norms, activations and residuals run: fused "
    "(Triton kernels + cuBLASLt GELU epilogue; the default when triton imports), compile "
    "(torch.compile) or torch (plain eager ops). CPU always uses torch.",
)
@click.option(
    "--exact-gelu",
    is_flag=True,
    help="[worker] CUDA, BERT-family, fused kernels: keep the exact erf GELU instead of the "
    "tanh approximation fused into the GEMM (as TEI serves it; within 4.7e-4 of erf).",
)
@click.option(
    "--no-compile",
    is_flag=True,
    help="[worker] CUDA: the same as --kernels torch (kept for old scripts).",
)
@click.option(
    "--profile-out",
    type=click.Path(dir_okay=False),
    hidden=True,
    help="[worker] Diagnostics: cProfile the compute loop while serving, stats to this file.",
)
@click.option(
    "--watchdog-s",
    type=click.FloatRange(min=0),
    default=None,
    help="[worker, all] Exit when holding batches with none answered for this long (a hung "
    "device: the supervisor then starts a fresh worker); 0 = never. Default "
    "mesh.config.WORKER_WATCHDOG_S (120).",
)
@click.option(
    "--test-hang-after",
    type=int,
    hidden=True,
    help="[worker] Test hook: the compute loop hangs after N batches.",
)
# ingress
@click.option("--http-host", default="127.0.0.1", help="[ingress, all] HTTP address to listen on.")
@click.option("--http-port", type=int, default=8000, help="[ingress, all] HTTP port.")
@click.option(
    "--api-key",
    help="[ingress, all] Require 'Authorization: Bearer KEY' on /v1/* and TEI's routes. Prefer EMBEDMESH_API_KEY "
    "or --api-key-file: any user can read a command line (ps); children get it by environment.",
)
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="[ingress, all] Read the API key from the first line of this file instead.",
)
@click.option(
    "--ingress-procs",
    type=click.IntRange(min=1),
    show_default="half the cores, at least 1",
    help="[ingress, all] Ingress processes serving the one HTTP port (SO_REUSEPORT: the kernel "
    "spreads connections between them), each with its own links to the broker(s); /metrics "
    "sums all of them. Tokenizing and encoding scale with processes.",
)
@click.option(
    "--reuse-port",
    is_flag=True,
    hidden=True,
    help="[ingress] Bind the HTTP port with SO_REUSEPORT (set on the children of "
    "--ingress-procs, which share it).",
)
@click.option(
    "--auto-truncate",
    is_flag=True,
    help="[ingress, all] Cut over-long inputs at the model's limit instead of a 422.",
)
@click.option(
    "--tei-model",
    help="[ingress, all] The model of TEI's routes (POST /, /embed, /tokenize, /decode, GET "
    "/info) for requests without an X-Embedmesh-Model header, whose bodies name none "
    "(default: the only model served; with several, such requests get 422).",
)
@click.option(
    "--max-body-bytes", type=int, default=16 << 20, help="[ingress] Largest request body."
)
@click.option(
    "--max-inputs", type=int, default=2048, help="[ingress] Inputs in one request at most."
)
@click.option(
    "--tokenizer-threads",
    type=int,
    default=4,
    help="[ingress] Threads tokenizing off the event loop.",
)
@click.option(
    "--tokenize-processes",
    type=click.IntRange(0, 64),
    default=config.TOKENIZE_PROCESSES,
    show_default=True,
    help="[ingress] Child processes tokenizing each ingress's bulk (batch-lane) requests, off "
    "its event loop's GIL, which live queries need; 0: on the tokenizer threads. They run at "
    "nice EMBEDMESH_BULK_NICE (10) under SCHED_IDLE (EMBEDMESH_BULK_SCHED=idle|nice).",
)
@click.option(
    "--ingress-nice",
    type=click.IntRange(0, 19),
    default=0,
    help="[ingress, all] Run the ingress processes this much nicer (lower OS priority) than "
    "the broker and workers, so that on a host whose cores the ingress tier saturates "
    "(bulk tokenization) the mesh's own hops still get a core at once. 0..19; 5 is a "
    "reasonable value beside a GPU worker (docs/tuning.md).",
)
@click.option(
    "--request-timeout",
    type=float,
    default=config.DEFAULT_REQUEST_TIMEOUT_S,
    help="[ingress] Seconds before a request fails with 504.",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=BODY_TIMEOUT_S,
    help="[ingress, all] Seconds a request body may take to arrive after its headers; "
    "later: 408 and the connection is closed.",
)
@click.option(
    "--drain-grace",
    type=click.FloatRange(min=0),
    default=DRAIN_GRACE_S,
    help="[ingress, all] On SIGTERM or SIGINT the ingress closes its listening socket at once "
    "(new connections are refused; a request on an open connection gets 503), lets accepted "
    "requests finish for up to this many seconds, then exits 0. --role all stops the "
    "ingresses first and waits this long (plus a margin) for them, then the workers (each "
    "finishes the batches it holds), then the broker.",
)
# all
@click.option("--workers", type=int, default=1, help="[all] Worker processes to start.")
@click.option(
    "--restart-limit",
    type=click.IntRange(min=0),
    default=RESTART_LIMIT,
    help="[all; ingress with --ingress-procs] A role process that dies while serving is "
    "restarted (after 1 s, doubling to 30 s) while the others keep serving; after this many "
    "restarts in a row (a 60 s run resets the count) the supervisor gives up, stops "
    "everything and exits 1. 0: never restart.",
)
# links
@click.option(
    "--heartbeat-interval",
    type=float,
    default=config.HEARTBEAT_INTERVAL_S,
    help="Seconds between heartbeats on every link.",
)
@click.option(
    "--heartbeat-liveness",
    type=int,
    default=config.HEARTBEAT_LIVENESS,
    help="Missed heartbeats after which a peer counts as dead.",
)
@click.option(
    "--curve-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of CurveZMQ keys (made with --gen-keys); secures every TCP link.",
)
@click.option(
    "--gen-keys",
    type=click.Path(file_okay=False, path_type=Path),
    help="Create CurveZMQ key pairs (broker, ingress, worker) in DIR and exit; copy DIR (or "
    "the files each host needs) to every host and pass it as --curve-dir.",
)
@click.option(
    "--insecure", is_flag=True, help="Allow binding a non-loopback address without CURVE keys."
)
@click.option(
    "--log-level",
    default="INFO",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    help="[every role] Log lines at this level and above go to stderr (--role all passes it "
    "to its children and prefixes each line with the child's name).",
)
@click.pass_context
def main(ctx: click.Context, role: str, **opts: object) -> None:
    """Run one role of an embedmesh mesh."""
    die_with_parent_from_env()  # a role started by `--role all`: first, before any slow start
    logging.basicConfig(
        level=str(opts["log_level"]),
        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if opts["gen_keys"] is not None:
        from mesh.transport import generate_keys

        where = generate_keys(opts["gen_keys"])  # type: ignore[arg-type]
        click.echo(f"CurveZMQ keys in {where}: pass --curve-dir {where} to every role")
        return
    liveness = Liveness(float(opts["heartbeat_interval"]), int(opts["heartbeat_liveness"]))  # type: ignore[arg-type]
    security = Security(opts["curve_dir"], bool(opts["insecure"]))  # type: ignore[arg-type]
    brokers = list(opts["broker_endpoints"])  # type: ignore[call-overload]
    try:
        if role == "broker":
            run_broker(
                str(opts["frontend"]),
                str(opts["backend"]),
                liveness,
                security,
                max_queued_tokens=opts["max_queued_tokens"],
                batch_timeout_s=opts["batch_timeout"],
                max_attempts=opts["max_attempts"],
                aging_s=opts["aging"],
                orphan_grace_s=opts["orphan_grace"],
                live_window_s=opts["live_window"],
                live_bulk_batches=opts["live_bulk_batches"],
                live_bulk_ms=opts["live_bulk_ms"],
                hang_s=opts["hang_timeout"],
                forget_model_s=opts["forget_model_after"],
            )
        elif role == "worker":
            device = f"cuda:{opts['gpu']}" if opts["gpu"] is not None else str(opts["device"])
            cfg = WorkerConfig(
                broker=brokers[0] if brokers else DEFAULT_BACKEND,
                model=opts["model"],  # type: ignore[arg-type]
                served_name=opts["served_name"],  # type: ignore[arg-type]
                device=device,
                dtype=opts["dtype"],  # type: ignore[arg-type]
                credits=opts["credits"],  # type: ignore[arg-type]
                live_lane=str(opts["live_lane"]),
                max_batch_tokens=opts["max_batch_tokens"],  # type: ignore[arg-type]
                max_batch_requests=int(opts["max_batch_requests"]),  # type: ignore[call-overload]
                threads=opts["threads"],  # type: ignore[arg-type]
                warmup_buckets=[int(b) for b in str(opts["warmup_buckets"]).split(",") if b],
                kernels=_kernels(opts),
                exact_gelu=bool(opts["exact_gelu"]),
                test_hang_after=opts["test_hang_after"],  # type: ignore[arg-type]
                # Unset: the default, and not forwarded to the workers of --role all.
                watchdog_s=config.WORKER_WATCHDOG_S
                if opts["watchdog_s"] is None
                else float(opts["watchdog_s"]),  # type: ignore[arg-type]
                profile_out=opts["profile_out"],  # type: ignore[arg-type]
            )
            run_worker(cfg, liveness, security)
        elif role == "ingress":
            from launch.ingress_role import run_ingress_role

            code = run_ingress_role(opts, liveness, security)
            if code:
                sys.exit(code)
        else:
            from launch.supervisor import run_all

            sys.exit(run_all(opts))
    except KeyboardInterrupt:
        pass
    except (InsecureBindError, zmq.ZMQError, OSError, ValueError) as exc:
        # Start-up failures a user can fix: one readable line, not a traceback.
        raise click.ClickException(f"{role}: {exc}") from exc


def _kernels(opts: dict[str, object]) -> str | None:
    """--kernels, or torch for the older --no-compile; both at once must agree."""
    kernels = opts["kernels"]
    if opts["no_compile"] and kernels not in (None, "torch"):
        raise click.UsageError(f"--no-compile means --kernels torch, not --kernels {kernels}")
    return "torch" if opts["no_compile"] else kernels  # type: ignore[return-value]


if __name__ == "__main__":
    main()

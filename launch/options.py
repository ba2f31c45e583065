"""``mesh-launch``'s options, each declared once: one typed dataclass per role.

Every field carries its default and a :class:`Spec` (help, help group, the roles it applies
to, its click type, whether it is a flag). From these declarations come the click options
(``launch.cli``), the ``EMBEDMESH_<NAME>`` variables, the keys of the ``--config`` TOML file
(``launch.config_file``) and the argv of the children of ``--role all``
(``launch.child_args``). A field with ``flag=False`` is an expert knob: no flag, only its
variable and its config key; a field with ``expert=True`` keeps its flag (scripts pass it) but
is left out of ``--help`` and documented with the config keys.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import click

from mesh import config
from mesh.ingress.config import (
    BODY_TIMEOUT_S,
    DRAIN_GRACE_S,
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_BATCH_FILE_BYTES,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_INPUTS,
    MAX_RESPONSE_BYTES,
    RESPONSE_BUDGET_BYTES,
)

ROLES = ("broker", "worker", "ingress", "all")
ENV_PREFIX = "EMBEDMESH_"
DEFAULT_FRONTEND = "tcp://127.0.0.1:5555"
DEFAULT_BACKEND = "tcp://127.0.0.1:5556"
RESTART_LIMIT = 5  # restarts in a row before --role all gives up; 3..10 is reasonable
LIVE_GATE_MS = 3.0  # mesh.worker.live_gate.LIVE_GATE_MS (a test keeps them equal)
SWITCH_US = 500.0  # mesh.worker.server.SWITCH_INTERVAL_S in microseconds

# Help groups, in the order --help shows them: (title, the roles they belong to).
GROUPS = {
    "link": "Link and logging options (every role)",
    "ingress": "Ingress options (--role ingress, all)",
    "broker": "Broker options (--role broker, all)",
    "worker": "Worker options (--role worker, all)",
    "gpu": "GPU worker options (--role worker, all)",
    "supervisor": "Whole-mesh options (--role all)",
}
_GROUP_ROLES = {
    "link": ROLES,
    "ingress": ("ingress", "all"),
    "broker": ("broker", "all"),
    "worker": ("worker", "all"),
    "gpu": ("worker", "all"),
    "supervisor": ("all",),
}


@dataclass(frozen=True)
class Spec:
    """How one option is offered: everything but its name and default."""

    help: str
    group: str
    type: click.ParamType | None = None  # None: a boolean flag
    roles: tuple[str, ...] = ()  # () : the roles of its group
    flag: bool = True  # False: an expert knob, set by its variable or the config file only
    expert: bool = False  # a flag left out of --help (documented with the config keys)
    internal: bool = False  # set by the launcher on its children only: no config key
    secret: bool = False  # never printed (and, as every secret, never in a child's argv)
    to_children: bool = True  # False: --role all keeps it (the API key's sources)
    multiple: bool = False
    env: str = ""  # "": EMBEDMESH_<NAME>
    name: str = ""  # the flag's name, when not the field's: "broker" -> --broker
    default_text: str = ""  # the default as --help and the reference say it, when not a value

    def applies_to(self, role: str) -> bool:
        return role in (self.roles or _GROUP_ROLES[self.group])


def opt(default: Any, help: str, group: str, type: click.ParamType | None = None, **kw: Any) -> Any:
    """A dataclass field declared with its :class:`Spec`."""
    spec = Spec(help, group, type, **kw)
    if isinstance(default, tuple | list):
        return field(default_factory=lambda: tuple(default), metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


INT, FLOAT, STR = click.INT, click.FLOAT, click.STRING


class BatchBudget(click.ParamType):
    """``--max-batch-tokens``: a positive number of tokens, or "auto" (measured at start)."""

    name = "INTEGER|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        text = str(value).strip().lower()
        if text == AUTO:
            return AUTO
        if text.isdigit() and int(text) >= 1:
            return int(text)
        self.fail(f"{value!r} is neither a positive number of tokens nor 'auto'", param, ctx)


AUTO = "auto"
BUDGET = BatchBudget()
POSITIVE = click.FloatRange(min=0, min_open=True)
NON_NEGATIVE = click.FloatRange(min=0)


@dataclass
class LinkArgs:
    """Every role: its links to the others and its logging."""

    broker_endpoints: tuple[str, ...] = opt((), "[worker] the broker's backend (default "
        f"{DEFAULT_BACKEND}); [ingress] the broker frontend(s), repeatable (default "
        f"{DEFAULT_FRONTEND}). Variable: EMBEDMESH_BROKER_ENDPOINTS, space-separated.", "link",
        STR, roles=("worker", "ingress"), multiple=True, env="EMBEDMESH_BROKER_ENDPOINTS",
        name="broker")  # fmt: skip
    curve_dir: Path | None = opt(None, "Directory of CurveZMQ keys (made with --gen-keys); "
        "secures every TCP link.", "link", click.Path(file_okay=False, path_type=Path))  # fmt: skip
    insecure: bool = opt(False, "Allow binding a non-loopback address without CURVE keys.", "link")
    log_level: str = opt("INFO", "Log lines at this level and above go to stderr.", "link",
        click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))  # fmt: skip
    heartbeat_interval: float = opt(config.HEARTBEAT_INTERVAL_S, "Seconds between heartbeats "
        "on every link; 0.1..5.", "link", FLOAT, expert=True)  # fmt: skip
    heartbeat_liveness: int = opt(config.HEARTBEAT_LIVENESS, "Missed heartbeats after which a "
        "peer counts as dead; 3..5.", "link", INT, expert=True)  # fmt: skip


@dataclass
class BrokerArgs:
    """The scheduler."""

    frontend: str | None = opt(None, "Endpoint ingresses (and MeshClients) connect to.",
        "broker", STR,
        default_text=f"{DEFAULT_FRONTEND}; --role all: a private ipc:// path")  # fmt: skip
    backend: str | None = opt(None, "Endpoint workers connect to.", "broker", STR,
        default_text=f"{DEFAULT_BACKEND}; --role all: a private ipc:// path")  # fmt: skip
    max_queued_tokens: int = opt(config.MAX_QUEUED_TOKENS, "Queued tokens per model before "
        "requests get 429; a request that would end past its timeout is refused too.",
        "broker", INT)  # fmt: skip
    batch_timeout: float = opt(config.BATCH_TIMEOUT_S, "Seconds a batch may take before its "
        "worker counts as hung; 10..300.", "broker", FLOAT, expert=True)  # fmt: skip
    max_attempts: int = opt(config.MAX_ATTEMPTS, "Dispatches of one input before it fails with "
        "WORKER_FAILED; 2..5.", "broker", INT, expert=True)  # fmt: skip
    orphan_grace: float | None = opt(None, "Seconds the queued work of a model whose last "
        "worker left waits for one to come back before it fails with 503.", "broker",
        NON_NEGATIVE, expert=True,
        default_text="one heartbeat expiry; --role all: --request-timeout")  # fmt: skip
    aging: float = opt(config.AGING_S, "Seconds after which waiting batch-lane work goes "
        "first; 0.2..10.", "broker", FLOAT, expert=True)  # fmt: skip
    live_window: float = opt(config.LIVE_WINDOW_S, "Seconds after an interactive request "
        "during which a model counts as serving live traffic.", "broker", NON_NEGATIVE,
        expert=True)  # fmt: skip
    live_bulk_batches: float = opt(config.LIVE_BULK_BATCHES, "While live traffic is about, the "
        "batch-lane work a worker without a live lane may hold, in its batch budgets "
        "(1: a query waits behind about one batch).", "broker", POSITIVE, expert=True)  # fmt: skip
    live_bulk_ms: float = opt(config.LIVE_BULK_MS, "... and in milliseconds of its compute "
        "(what keeps a query's wait short on a CPU).", "broker", POSITIVE, expert=True)  # fmt: skip
    hang_timeout: float = opt(config.HANG_S, "Seconds a worker holding batches may report no "
        "progress before it is buried as hung and its batches requeued.", "broker", POSITIVE,
        expert=True)  # fmt: skip
    forget_model_after: float = opt(config.MODEL_FORGET_S, "Seconds after its last worker left "
        "that a model is forgotten (404 instead of 503).", "broker", POSITIVE,
        expert=True)  # fmt: skip
    cpu_bulk_ms: float = opt(config.CPU_BULK_MS, "The batch-lane work a CPU worker may hold at "
        "any time, live or not, in milliseconds of its compute, one credit kept free: what a "
        "query waits behind on a CPU (in place of live_bulk_ms); 0: as any worker.", "broker",
        NON_NEGATIVE, expert=True)  # fmt: skip


@dataclass
class WorkerArgs:
    """The engine: one model on one device."""

    model: str | None = opt(None, "Model directory in Hugging Face layout.", "worker",
        click.Path(exists=True, file_okay=False),
        default_text="the embedded all-MiniLM-L6-v2")  # fmt: skip
    served_name: str | None = opt(None, "Name clients use for the model.", "worker", STR,
        default_text="from the model directory")  # fmt: skip
    device: str = opt("cpu", "cpu, cuda or cuda:N.", "worker", STR)
    dtype: str | None = opt(None, "Weights and activations.", "worker",
        click.Choice(["float32", "float16", "bfloat16"]),
        default_text="float32 on CPU, bf16/fp16 on GPU")  # fmt: skip
    threads: int | None = opt(None, "torch threads of each worker.", "worker", INT,
        default_text="one per core; --role all on CPU: the cores split between "
        "--workers")  # fmt: skip
    max_batch_tokens: int | str | None = opt(None, "Token budget of one batch, or auto: "
        "measured at start (the smallest budget within 5% of the best throughput of a short "
        "sweep, logged with its curve).", "worker", BUDGET,
        default_text="auto on CPU; on GPU the largest CUDA graph bucket, 16384")  # fmt: skip
    credits: int | None = opt(None, "Batches in flight at once; 1..8.", "worker", INT,
        default_text=f"{config.WORKER_CREDITS}, one more with a live lane")  # fmt: skip
    max_batch_requests: int = opt(config.MAX_BATCH_REQUESTS, "Sequences in one batch at most.",
        "worker", INT, expert=True)  # fmt: skip
    watchdog_s: float | None = opt(None, "Exit when holding batches with none answered for "
        "this long (the supervisor starts a fresh worker); 0 = never.", "worker", NON_NEGATIVE,
        expert=True, default_text=f"{config.WORKER_WATCHDOG_S:g}")  # fmt: skip
    profile_out: str | None = opt(None, "Diagnostics: cProfile the compute loop while "
        "serving, stats to this file.", "worker", click.Path(dir_okay=False),
        expert=True)  # fmt: skip
    gpu: int | None = opt(None, "CUDA device index; the same as --device cuda:N.", "gpu", INT)
    kernels: str | None = opt(None, "How per-layer norms, activations and residuals run on "
        "CUDA: fused (Triton + cuBLASLt GELU epilogue), compile (torch.compile) or torch.",
        "gpu", click.Choice(["torch", "compile", "fused"]),
        default_text="fused when triton imports")  # fmt: skip
    warmup_buckets: str = opt("", "Token buckets whose CUDA graphs are captured at start, "
        "comma-separated (e.g. 16,64,256,1024); the others lazily.", "gpu", STR)  # fmt: skip
    live_lane: str = opt("auto", "Run small batches (live queries) beside bulk on a "
        "high-priority CUDA stream, keeping one credit for them; auto: on for CUDA unless "
        "--credits 1.", "gpu", click.Choice(["auto", "on", "off"]), expert=True)  # fmt: skip
    exact_gelu: bool = opt(False, "BERT family, fused kernels: the exact erf GELU instead of "
        "the tanh form fused into the GEMM (as TEI serves it).", "gpu", expert=True)  # fmt: skip
    no_compile: bool = opt(False, "The same as --kernels torch (kept for old scripts).", "gpu",
        expert=True)  # fmt: skip
    live_gate_ms: float = opt(LIVE_GATE_MS, "How long one bulk checkpoint waits for running "
        "live batches, in ms; 0..20, 0 turns the gate off.", "gpu", FLOAT, flag=False)  # fmt: skip
    worker_switch_us: float = opt(SWITCH_US, "The GIL switch interval while serving, in "
        "microseconds; 50..5000 (for measuring).", "worker", FLOAT, flag=False)  # fmt: skip
    flashinfer_pdl: bool | None = opt(None, "Diagnostics: FlashInfer kernels with (true) or "
        "without (false) programmatic dependent launch.", "gpu", click.BOOL, flag=False,
        default_text="FlashInfer's choice")  # fmt: skip
    window_mask: str = opt("flashinfer", "What runs the batches a sliding window cuts: "
        "flashinfer or sdpa (grouped SDPA, the fallback).", "gpu",
        click.Choice(["flashinfer", "sdpa"]), flag=False)  # fmt: skip
    shared_capture_stream: bool = opt(False, "Diagnostics: capture every CUDA graph on "
        "torch's one default capture stream.", "gpu", click.BOOL, flag=False)  # fmt: skip

    @property
    def device_name(self) -> str:
        return f"cuda:{self.gpu}" if self.gpu is not None else self.device

    @property
    def buckets(self) -> list[int]:
        return [int(b) for b in self.warmup_buckets.split(",") if b.strip()]


@dataclass
class IngressArgs:
    """The HTTP gateway."""

    http_host: str = opt("127.0.0.1", "HTTP address to listen on.", "ingress", STR)
    http_port: int = opt(8000, "HTTP port.", "ingress", INT)
    api_key: str | None = opt(None, "Require 'Authorization: Bearer KEY' on /v1/* and TEI's "
        "routes. Prefer EMBEDMESH_API_KEY or --api-key-file: any user can read a command "
        "line.", "ingress", STR, secret=True, to_children=False)  # fmt: skip
    api_key_file: Path | None = opt(None, "Read the API key from the first line of this file.",
        "ingress", click.Path(exists=True, dir_okay=False, path_type=Path),
        to_children=False)  # fmt: skip
    ingress_procs: int | None = opt(None, "Ingress processes sharing the HTTP port "
        "(SO_REUSEPORT); tokenizing and encoding scale with them.", "ingress",
        click.IntRange(min=1), default_text="half the cores, at least 1")  # fmt: skip
    auto_truncate: bool = opt(False, "Cut over-long inputs at the model's limit instead of a "
        "422.", "ingress")  # fmt: skip
    tei_model: str | None = opt(None, "The model of TEI's routes for requests that name none.",
        "ingress", STR, default_text="the only model served")  # fmt: skip
    request_timeout: float = opt(config.DEFAULT_REQUEST_TIMEOUT_S, "Seconds before a request "
        "fails with 504.", "ingress", FLOAT)  # fmt: skip
    max_body_bytes: int = opt(MAX_BODY_BYTES, "Largest request body.", "ingress", INT,
        expert=True)  # fmt: skip
    max_inputs: int = opt(MAX_INPUTS, "Inputs in one request at most.", "ingress", INT,
        expert=True)  # fmt: skip
    tokenizer_threads: int = opt(4, "Threads tokenizing off the event loop.", "ingress", INT,
        expert=True)  # fmt: skip
    tokenize_processes: int = opt(config.TOKENIZE_PROCESSES, "Child processes tokenizing each "
        "ingress's bulk requests off its event loop's GIL; 0: on the tokenizer threads.",
        "ingress", click.IntRange(0, 64), expert=True)  # fmt: skip
    ingress_nice: int = opt(0, "Run the ingress processes this much nicer than the broker "
        "and workers; 0..19, 5 is reasonable beside a GPU worker.", "ingress",
        click.IntRange(0, 19), expert=True)  # fmt: skip
    body_timeout: float = opt(BODY_TIMEOUT_S, "Seconds a request body may take to arrive after "
        "its headers (then 408); a file upload may take longer while it keeps arriving.", "ingress", POSITIVE, expert=True)  # fmt: skip
    drain_grace: float = opt(DRAIN_GRACE_S, "On SIGTERM, seconds accepted requests get to "
        "finish before the ingress exits (new ones are refused).", "ingress", NON_NEGATIVE,
        expert=True)  # fmt: skip
    bulk_nice: int = opt(config.BULK_NICE, "How much nicer bulk tokenization runs than live "
        "work; 0..19, 0 = the same.", "ingress", click.IntRange(0, 19), flag=False)  # fmt: skip
    bulk_sched: str = opt(config.BULK_SCHED, "idle: the bulk tokenizer processes run under "
        "SCHED_IDLE; nice: at bulk_nice alone.", "ingress", click.Choice(["idle", "nice"]),
        flag=False)  # fmt: skip
    word_memo: bool = opt(True, "Memoize the token ids of frequent words.", "ingress",
        click.BOOL, flag=False)  # fmt: skip
    reuse_port: bool = opt(False, "Bind the HTTP port with SO_REUSEPORT (the children of "
        "--ingress-procs).", "ingress", roles=("ingress",), internal=True)  # fmt: skip
    # The Files and Batches API (mesh.ingress.batches): its store, limits and retention.
    state_dir: Path | None = opt(None, "Directory of the batch API's state: its SQLite "
        "database and files (with --state-url, the files only: a volume every ingress host "
        "mounts).", "ingress", click.Path(file_okay=False, path_type=Path),
        default_text="$XDG_STATE_HOME/embedmesh, else ~/.local/state/embedmesh")  # fmt: skip
    state_url: str | None = opt(None, "postgresql://... : keep the batch API's state in "
        "PostgreSQL, shared by every ingress host (a password belongs in PGPASSWORD or "
        "~/.pgpass, not here).", "ingress", STR, expert=True)  # fmt: skip
    max_batch_file_bytes: int = opt(MAX_BATCH_FILE_BYTES, "Largest file POST /v1/files "
        "takes (413 beyond); OpenAI's limit.", "ingress", click.IntRange(min=1),
        expert=True)  # fmt: skip
    max_state_bytes: int = opt(0, "Bytes every stored batch file may take together; an upload "
        "past it is refused with 507; 0: no limit but the disk.", "ingress",
        click.IntRange(min=0), expert=True)  # fmt: skip
    batch_retention: str = opt("30d", "How long a finished batch's output and error files "
        "are kept (s, m, h or d); input files stay until deleted.", "ingress", STR,
        expert=True)  # fmt: skip
    ingress_slot: int | None = opt(None, "This ingress's place among --ingress-procs "
        "siblings: its batch leases' owner id.", "ingress", INT, roles=("ingress",),
        internal=True)  # fmt: skip
    header_timeout: float = opt(HEADER_TIMEOUT_S, "Seconds a request's headers may take to "
        "arrive after its first byte (then 408 and the connection closes).", "ingress",
        POSITIVE, expert=True)  # fmt: skip
    idle_timeout: float = opt(IDLE_TIMEOUT_S, "Seconds a connection with no request running "
        "stays open; keep it above a load balancer's idle timeout.", "ingress", POSITIVE,
        expert=True)  # fmt: skip
    max_connections: int = opt(MAX_CONNECTIONS, "Open connections per ingress process; past "
        "it a new one gets 503 with Retry-After and is closed.", "ingress",
        click.IntRange(min=1), expert=True)  # fmt: skip
    max_response_bytes: int = opt(MAX_RESPONSE_BYTES, "Largest response body, estimated once "
        "the request is tokenized (rows x dimensions x format); a larger one is 413.",
        "ingress", click.IntRange(min=1), expert=True)  # fmt: skip
    response_budget_bytes: int = opt(RESPONSE_BUDGET_BYTES, "Bytes of the responses one "
        "ingress process builds and sends at once; past it a request gets 429 with "
        "Retry-After.", "ingress", click.IntRange(min=1), expert=True)  # fmt: skip


@dataclass
class SupervisorArgs:
    """``--role all`` (and the parent of ``--role ingress --ingress-procs N``)."""

    workers: int = opt(1, "Worker processes to start.", "supervisor", click.IntRange(min=1))
    restart_limit: int = opt(RESTART_LIMIT, "Restarts in a row of a role that dies while "
        "serving (after 1 s, doubling to 30 s) before the supervisor stops everything and "
        "exits 1; 0: never restart.", "supervisor", click.IntRange(min=0),
        roles=("all", "ingress"), expert=True)  # fmt: skip


SECTIONS: dict[str, type] = {
    "link": LinkArgs,
    "broker": BrokerArgs,
    "worker": WorkerArgs,
    "ingress": IngressArgs,
    "supervisor": SupervisorArgs,
}


@dataclass
class LaunchArgs:
    """Every option of ``mesh-launch``, one section per role."""

    link: LinkArgs = field(default_factory=LinkArgs)
    broker: BrokerArgs = field(default_factory=BrokerArgs)
    worker: WorkerArgs = field(default_factory=WorkerArgs)
    ingress: IngressArgs = field(default_factory=IngressArgs)
    supervisor: SupervisorArgs = field(default_factory=SupervisorArgs)

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> LaunchArgs:
        """From option names to values (click's params); names not given keep their default."""
        sections = {
            name: kind(**{f.name: values[f.name] for f in fields(kind) if f.name in values})
            for name, kind in SECTIONS.items()
        }
        return cls(**sections)

    def value(self, name: str) -> Any:
        return getattr(getattr(self, SECTION_OF[name]), name)

    def replaced(self, **values: Any) -> LaunchArgs:
        """A copy with the options named (in any section) set to ``values``."""
        sections = {name: getattr(self, name) for name in SECTIONS}
        for name, value in values.items():
            section = SECTION_OF[name]
            sections[section] = replace(sections[section], **{name: value})
        return LaunchArgs(**sections)


@dataclass(frozen=True)
class Declared:
    """One declared option: its section, name, default and spec."""

    section: str
    name: str
    default: Any
    spec: Spec

    @property
    def env(self) -> str:
        return self.spec.env or ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + (self.spec.name or self.name).replace("_", "-")


def declared() -> Iterator[Declared]:
    """Every option, section by section, in declaration order."""
    for section, kind in SECTIONS.items():
        for f in fields(kind):
            default = f.default_factory() if callable(f.default_factory) else f.default
            yield Declared(section, f.name, default, f.metadata["spec"])


SECTION_OF = {d.name: d.section for d in declared()}


def default_ingress_procs() -> int:
    """Half the cores this process may run on, at least 1: tokenizing and encoding scale with
    processes, and the other half is left to the broker, workers and the kernel's network work
    (a 2-core host keeps its one ingress)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // 2)


def ingress_procs(args: LaunchArgs) -> int:
    """How many ingress processes serve the port: ``--ingress-procs``, else the default."""
    given = args.ingress.ingress_procs
    return given if given is not None else default_ingress_procs()

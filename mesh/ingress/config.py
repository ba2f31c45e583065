"""Settings of one ingress (REST bridge) process; ``mesh-launch --role ingress`` fills them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mesh.config import DEFAULT_REQUEST_TIMEOUT_S, TOKENIZE_PROCESSES, Liveness

MAX_BODY_BYTES = 16 << 20  # a request body; 2048 inputs of ~8 kB text fit
MAX_INPUTS = 2048  # inputs in one request, as the OpenAI API allows
# After SIGTERM, requests already accepted get this long to finish; 5..300 is reasonable (the
# longest request you expect, within what the service manager waits: systemd's 90 s default).
DRAIN_GRACE_S = 30.0
# A request body must arrive within this long of its headers, else 408: a client that stalls
# must not hold a connection (and, during a drain, the stop) for ever; 5..120 is reasonable.
BODY_TIMEOUT_S = 30.0
# mesh.ingress.connections: once a request's first byte came, its headers must arrive within
# HEADER_TIMEOUT_S (else 408; nginx's client_header_timeout is 60 s, Node's 60 s; 5..60 is
# reasonable); a connection without a request running closes after IDLE_TIMEOUT_S (nginx's
# keepalive_timeout; keep it above a load balancer's idle timeout; 5..600); past
# MAX_CONNECTIONS open connections a process answers new ones 503 (1024..65536).
HEADER_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 75.0
MAX_CONNECTIONS = 4096


# mesh.ingress.responses: the bytes of one response at most (else 413; 2048 inputs x 4096
# dimensions as JSON floats are ~117 MB) and of all the responses one process builds and
# sends at once (else 429); the second at least the first; 16 MiB..2 GiB is reasonable.
MAX_RESPONSE_BYTES = 128 << 20
RESPONSE_BUDGET_BYTES = 384 << 20


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS


def tokenize_processes_from_env() -> int:
    """``EMBEDMESH_TOKENIZE_PROCESSES`` (0 = bulk tokenization on threads), else the default."""
    try:
        return max(0, int(os.environ.get("EMBEDMESH_TOKENIZE_PROCESSES", TOKENIZE_PROCESSES)))
    except ValueError:
        return TOKENIZE_PROCESSES


@dataclass
class IngressConfig:
    brokers: list[str]
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    api_key: str | None = None  # Bearer token required on /v1/* when set
    auto_truncate: bool = False  # cut over-long inputs at the model's limit instead of 422
    # The model of TEI's routes when a request has no X-Embedmesh-Model header (their bodies
    # name none); None: the only model served.
    tei_model: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    max_inputs: int = MAX_INPUTS
    tokenizer_threads: int = 4
    # Child processes tokenizing the batch lane (mesh.client.tokenize_procs); 0: threads.
    tokenize_processes: int = field(default_factory=tokenize_processes_from_env)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    liveness: Liveness = field(default_factory=Liveness)
    # Bind with SO_REUSEPORT: one of --ingress-procs N processes sharing the port. Off for a
    # lone ingress, so that a second server on a busy port fails instead of sharing it.
    reuse_port: bool = False
    drain_grace_s: float = DRAIN_GRACE_S
    body_timeout_s: float = BODY_TIMEOUT_S
    # Header-read and idle timeouts, the cap on open connections (mesh.ingress.connections).
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    max_response_bytes: int = MAX_RESPONSE_BYTES
    response_budget_bytes: int = RESPONSE_BUDGET_BYTES
    # The Files and Batches API's store and runner; None: those routes answer 503.
    jobs: JobsConfig | None = None


# OpenAI's limit on a batch input file, kept so that a file OpenAI takes is taken here too;
# with 100 lines a chunk, the runner never holds more than a chunk of it in memory.
MAX_BATCH_FILE_BYTES = 200 << 20
# Finished batches' output and error files are deleted this long after the batch ends, as
# OpenAI's 30 days; uploaded input files stay until deleted.
BATCH_RETENTION_S = 30 * 24 * 3600.0


@dataclass
class JobsConfig:
    """Where an ingress keeps the Files and Batches API's state, and its limits."""

    state_dir: str  # the SQLite database and the blobs (with state_url: the blobs only)
    state_url: str | None = None  # postgresql://... for a fleet
    owner: str = "ingress"  # this process's lease owner id: host, port and process slot
    max_file_bytes: int = MAX_BATCH_FILE_BYTES
    max_state_bytes: int = 0  # every stored file together; 0: no limit but the disk
    retention_s: float = BATCH_RETENTION_S

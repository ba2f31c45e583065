"""Settings of one ingress (REST bridge) process; ``mesh-launch --role ingress`` fills them."""

from __future__ import annotations

from dataclasses import dataclass, field

from mesh.config import DEFAULT_REQUEST_TIMEOUT_S, Liveness

MAX_BODY_BYTES = 16 << 20  # a request body; 2048 inputs of ~8 kB text fit
MAX_INPUTS = 2048  # inputs in one request, as the OpenAI API allows


@dataclass
class IngressConfig:
    brokers: list[str]
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    api_key: str | None = None  # Bearer token required on /v1/* when set
    auto_truncate: bool = False  # cut over-long inputs at the model's limit instead of 422
    max_body_bytes: int = MAX_BODY_BYTES
    max_inputs: int = MAX_INPUTS
    tokenizer_threads: int = 4
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    liveness: Liveness = field(default_factory=Liveness)
    # Bind with SO_REUSEPORT: one of --ingress-procs N processes sharing the port. Off for a
    # lone ingress, so that a second server on a busy port fails instead of sharing it.
    reuse_port: bool = False

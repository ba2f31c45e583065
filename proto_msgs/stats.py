"""The parts of ``BrokerStats`` that describe lanes, batches and workers (carried on every Pong).

Counters (``*_done``, ``batches``, ``wait_counts``) count from the broker's start; an ingress
exports them as Prometheus counters, and a restarted broker (a new ``Pong.instance``) starts
them again from zero, which ``rate()`` reads as the reset it is. Gauges are the state at the
Pong. Every field has a default, so a peer that predates one still decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Upper bounds (seconds) of the broker's queue-wait histogram; one more count for "above".
WAIT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0,
)  # fmt: skip
# What a worker is doing, as WorkerStats.state says it.
WORKER_STATES: tuple[str, ...] = ("up", "busy", "down")


@dataclass
class LaneStats:
    """One lane of one model at the broker."""

    queued_sequences: int = 0  # waiting now
    queued_tokens: int = 0
    sequences_done: int = 0  # counters: sequences whose batch came back with a result
    tokens_done: int = 0
    # Queue wait of each dispatched part of a request (arrival to its first dispatch), as
    # counts per WAIT_BUCKETS_S bucket (not cumulative) plus one above the last, and their sum.
    wait_counts: list[int] = field(default_factory=list)
    wait_sum_s: float = 0.0


@dataclass
class ModelStats:
    """One model at the broker: its lanes, the batches formed for it, its backlog in time."""

    lanes: list[LaneStats] = field(default_factory=list)  # indexed by Lane: interactive, batch
    batches: int = 0  # counters: batches dispatched, their tokens, and the budgets they filled
    batch_tokens: int = 0
    batch_budget_tokens: int = 0  # the sum of each batch's worker max_batch_tokens
    # Seconds its workers need for what is queued (queued tokens / their measured tokens/s):
    # the scaling signal; 0 while the rate is not known yet (drain_rate absent).
    queued_s: float = 0.0


@dataclass
class WorkerStats:
    """One worker behind the broker: live (up, busy) or recently gone (down)."""

    id: str  # the broker's routing id for its connection, hex: unique while it lives
    name: str  # what the worker calls itself (host:device); several may share one
    model: str
    device: str
    state: str  # one of WORKER_STATES
    inflight_batches: int = 0
    credits: int = 0
    tokens_per_s: float = 0.0  # its measured compute rate; 0 while unknown
    batches_done: int = 0  # counters while it lived
    tokens_done: int = 0
    since_s: float = 0.0  # up/busy: seconds since it was last heard; down: since it went
    reason: str = ""  # why it went down

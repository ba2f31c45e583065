"""Protocol and scheduling constants, with their sane ranges. CLI flags override them."""

from __future__ import annotations

from dataclasses import dataclass

HEARTBEAT_INTERVAL_S = 1.0  # 0.1..5 is reasonable; tests use 0.2 to detect failure fast
HEARTBEAT_LIVENESS = 3  # missed intervals before a peer is dead; 3..5 is reasonable
RECONNECT_BACKOFF_MIN_S = 1.0  # worker reconnect backoff starts here ...
RECONNECT_BACKOFF_MAX_S = 32.0  # ... and doubles up to here
WORKER_CREDITS = 2  # 2 = one batch running, one prefetched; 1..8 is reasonable
MAX_BATCH_TOKENS_CPU = 8192  # per batch on CPU; 2k..16k
MAX_BATCH_TOKENS_GPU = 16384  # per batch on a GPU; 8k..64k (FlashInfer plan cost is per batch)
MAX_BATCH_REQUESTS = 512  # sequences per batch; 32..2048
MAX_QUEUED_TOKENS = 4_000_000  # per model before OVERLOADED; ~ a few seconds of GPU work
BATCH_TIMEOUT_S = 60.0  # a batch not back by then marks its worker hung; 10..300
# A worker holding batches whose heartbeat progress counter (finished batches) has not moved
# for this long is hung (a live socket in front of a stuck compute loop), counted from the later
# of its last progress and the dispatch of its oldest held batch. Longer than the slowest
# batch's compute; 5..300.
HANG_S = 30.0
MAX_ATTEMPTS = 3  # dispatches of one sequence before WORKER_FAILED; 2..5
# A worker that holds batches and answers none for this long exits (code EXIT_HUNG), so that
# its supervisor (mesh-launch, systemd) starts a fresh one: a device that deadlocked leaves its
# threads in a synchronize for good, the GPU held, and the broker can only stop sending to it
# (CHANGELOG.md: the live lane's stall). Longer than HANG_S and than a first batch that waits
# for FlashInfer's JIT (~40 s a head_dim); 0 turns it off; 60..600.
WORKER_WATCHDOG_S = 120.0
AGING_S = 1.0  # a batch-lane head older than this goes before interactive work; 0.2..10
# Live work first: while a model has interactive work waiting, or had some within LIVE_WINDOW_S,
# the batch-lane tokens each worker holds in flight stay within LIVE_BULK_BATCHES of its
# max_batch_tokens, so a query waits behind about one batch, not one per credit. The bulk rate
# meanwhile loses the prefetch overlap of the second credit; set it to the credits (2) to turn
# the cap off.
LIVE_WINDOW_S = 1.0  # 0.2..10: about the gap between queries that still counts as live traffic
LIVE_BULK_BATCHES = 1.0  # 0.5..2: bulk a worker may hold while live, in its batch budgets
# ... and at most this much of its compute time, from the rate its large batches ran at: on a
# GPU one 16k batch is 2-30 ms, so the batch cap above binds; on a CPU one 8k batch is over a
# second, so this one does (bulk goes in small batches while queries come). 20..1000.
LIVE_BULK_MS = 100.0
# A CPU worker holds at most this much batch-lane work at any time, live traffic or not, in
# milliseconds of its compute (and one credit stays free), in place of LIVE_BULK_MS: a query
# arriving after a quiet spell then waits behind one short bulk batch, not a full one of a
# second or more. Longer than LIVE_BULK_MS because a CPU pays for each batch: its round trip
# idles the cores, and at 20 queries a second each bulk batch sees about two query forwards
# (13 ms each on 2 cores) go first; at 100 ms, bulk kept 0.79-0.83 of its rate at 5 queries a
# second. On a GPU the live lane (or the live window's cap) does this. 0 turns it off; 50..300.
CPU_BULK_MS = 150.0
# Batches of at least this many tokens (or half the worker's budget, if smaller) may lower
# the broker's rate of a worker: small ones are all fixed cost and would make it look slow.
RATE_MIN_BATCH_TOKENS = 1024
# A model whose last worker left is forgotten by the broker after this long: requests for it then
# get MODEL_NOT_FOUND instead of UNAVAILABLE. As the ingress's FORGET_UNSERVED_AFTER_S; 60..3600.
MODEL_FORGET_S = 600.0
# Bulk tokenization threads of a client (the ingress) run this much nicer than live work, so
# that a query's hops get the CPU first on a busy host (mesh/client/executor.py); 0..19, 0 = off.
# EMBEDMESH_BULK_NICE overrides it. On (any value > 0) it also turns tokenizers' own thread pool
# off: on the H200 host, eight ingress processes each running that pool on all 16 cores capped
# bulk through HTTP at 3.5 M tok/s (MiniLM); without it 5.1 M, and the live p99 under that bulk
# fell from 63 to 18 ms (docs/tuning.md). On the 2-core machine it changed nothing measurable.
BULK_NICE = 10
# The ingress's bulk tokenizer processes (TOKENIZE_PROCESSES) also run under Linux's SCHED_IDLE
# ("idle"): only on a core nothing else wants, giving way at once to any task that wakes, the
# live query's hops in the ingress, broker and worker among them. "nice" leaves them at
# BULK_NICE alone; EMBEDMESH_BULK_SCHED overrides it. On the H200 (MiniLM, nice and idle
# alternated, five pairs over three calls) bulk beside live ran at 5.4-6.3 M tok/s against
# 4.8-5.8 M and the live p99 was 10.1-12.8 ms against 11.4-18.4: at nice 10 the worker's launch
# thread was short of CPU and fed the GPU more slowly (docs/tuning.md). On the 2-core machine it
# cost nothing (docs/tuning.md).
BULK_SCHED = "idle"
# Child processes of each ingress that tokenize its batch-lane work, so that the event loop
# carrying live queries never waits for a tokenizer thread's GIL (mesh/client/tokenize_procs.py:
# on the H200, MiniLM's live p99 under bulk went 20-29 -> 15-18 ms). As many as the bulk
# tokenizer threads they replace; 0 = threads. EMBEDMESH_TOKENIZE_PROCESSES overrides it.
TOKENIZE_PROCESSES = 3
DEFAULT_REQUEST_TIMEOUT_S = 120.0  # client-side deadline when the caller gives none
# Sparse (SPLADE) output: every weight by default, as TEI. The most (id, weight) pairs one
# request's answer could hold, inputs x top_k (x the vocabulary without top_k), whatever the
# model gives: 549 inputs of BERT's 30,522 entries without top_k, 67 of bge-m3's 250,002,
# 16,384 with top_k 1024; 128 MiB of float32 pairs at worst (a real SPLADE text keeps ~100).
# 2**22..2**25 is reasonable.
MAX_SPARSE_PAIRS = 1 << 24


@dataclass
class Liveness:
    """Heartbeat timing shared by both ends of a link."""

    interval_s: float = HEARTBEAT_INTERVAL_S
    liveness: int = HEARTBEAT_LIVENESS

    @property
    def expiry_s(self) -> float:
        """Silence after which the peer is considered dead."""
        return self.interval_s * self.liveness

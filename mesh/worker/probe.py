"""The rate a worker announces before it has served anything: one probe batch, timed.

A fresh broker knows nothing of its workers' speed, and admission in time
(``mesh.broker.queue``) needs a rate: without one, a fresh mesh would admit bulk requests
that end in 504 after their whole timeout. So a worker times a probe batch at start and
sends the rate in its ``WorkerReady`` (``tokens_per_s``, unless ``--max-batch-tokens auto``
measured one); the broker uses it until the worker's large batches teach it the real one.

The probe is conservative by construction: it is smaller than a serving batch (PROBE_TOKENS
in the auto sweep's synthetic sequences, ``mesh.worker.budget.synthetic_batch``; a device is
less efficient on less work), so its rate is at most the bulk rate, and the broker refuses by it
no more than a slower worker's broker would. The first run pays one-time start-up costs and is
not timed.
"""

from __future__ import annotations

import logging

from mesh.worker.budget import time_batch
from mesh.worker.engine.runner import EngineEntry

log = logging.getLogger("embedmesh.worker")

PROBE_TOKENS = 512  # tokens of the probe batch, at most the worker's budget; 256..4096


def probe_rate(engine: EngineEntry, max_batch_tokens: int, max_input_tokens: int) -> float:
    """Tokens per second of ``engine`` on a probe batch; 0.0 when it cannot be timed (the
    broker then learns the rate from served batches only)."""
    tokens = max(1, min(PROBE_TOKENS, max_batch_tokens))
    try:
        seconds = time_batch(engine, tokens, max_input_tokens, repeats=1, warm=True)
    except Exception:  # an estimate: a model the probe cannot run is still served
        log.warning("could not time a probe batch; admission waits for served batches",
                    exc_info=True)  # fmt: skip
        return 0.0
    rate = tokens / seconds
    log.info("probe batch: %d tokens in %.1f ms, %.0f tokens/s", tokens, seconds * 1000,
             rate)  # fmt: skip
    return rate

"""A real worker (``mesh/worker``) around an engine that computes nothing: what a bench run
measures with it is the mesh alone (ingress, broker, links, the worker's I/O), never a model.

    python -m bench.null_worker --broker tcp://10.0.0.2:5556 --device cpu --curve-dir keys

The arguments are ``mesh-launch --role worker`` flags, parsed by mesh-launch itself. The model
(``--model``, default the embedded one) is read for its card only: its tokenizer and
dimensions are what the mesh is told in READY, so the ingress tokenizes real text as it
would for the real engine; no weights are loaded. Every batch gets deterministic rows at
once: one per sequence, of the card's dimensions, a function of the sequence's length and
first token (so a client can tell rows apart and one input always gets the same vector).
``--device`` names the worker (it is in its READY) but the rows are made on the CPU.
Kept out of ``mesh-launch``'s flags: serving vectors that mean nothing is for the bench.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np
import torch

from mesh.worker.engine.card import ModelCard, default_model_path, read_card, read_config
from mesh.worker.engine.engine import default_max_batch_tokens
from mesh.worker.engine.runner import EngineBatch, EngineOutputs


@dataclass
class NullEngine:
    """The worker's engine entry (:class:`mesh.worker.engine.runner.EngineEntry`) with a
    model's card and no model: ``run`` answers every batch without computing."""

    card: ModelCard
    vocab_size: int
    hidden_size: int
    max_batch_tokens: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    has_lexical: bool = False
    batches: int = 0  # batches answered, for tests and logs

    @classmethod
    def from_model(cls, model_dir: str | Path, max_batch_tokens: int | None = None,
                   served_name: str | None = None) -> NullEngine:  # fmt: skip
        """The card of ``model_dir`` (its tokenizer and config only; weights unread)."""
        config = read_config(model_dir)
        card = read_card(model_dir, served_name=served_name)
        return cls(
            card,
            vocab_size=int(config.get("vocab_size", 30522)),
            hidden_size=int(config.get("hidden_size", card.dims)),
            max_batch_tokens=max_batch_tokens or default_max_batch_tokens("cpu"),
        )

    def run(self, batch: EngineBatch) -> EngineOutputs:
        self.batches += 1
        pooled = self.embed(batch.ids, batch.offsets)
        rows = None
        if batch.spans is not None:
            rows = torch.ones(len(batch.spans), self.hidden_size, dtype=torch.float32)
        return EngineOutputs(pooled, span_rows=rows)

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        """``float32 [n, dims]``: row i is 1 everywhere but its first two columns, which hold
        sequence i's length and first token id (plus one: a row is never all equal)."""
        offsets = np.asarray(offsets)
        n = len(offsets) - 1
        rows = torch.ones(n, max(2, self.card.dims), dtype=torch.float32)[:, : self.card.dims]
        if n:
            lengths = np.diff(offsets).astype(np.float32)
            first = np.asarray(ids)[offsets[:-1]].astype(np.float32) + 1.0
            rows[:, 0] = torch.from_numpy(lengths)
            if self.card.dims > 1:
                rows[:, 1] = torch.from_numpy(first)
        return rows

    def project_multivector(self, rows: torch.Tensor) -> torch.Tensor:
        return rows

    def live_lane(self, max_tokens: int) -> NullEngine:
        return self

    def warmup(self, buckets: list[int], spans: bool = False) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    """Parse ``mesh-launch --role worker`` flags, serve a :class:`NullEngine` until stopped."""
    from launch.children import die_with_parent_from_env
    from launch.cli import parse
    from launch.roles import liveness_of, security_of, serve_worker

    die_with_parent_from_env()  # started by mesh-bench cluster: ends with it

    try:
        _, args = parse(["--role", "worker", *(sys.argv[1:] if argv is None else argv)])
    except click.ClickException as exc:  # a wrong flag: mesh-launch's message, not a trace
        exc.show()
        return exc.exit_code
    logging.basicConfig(
        level=args.link.log_level,
        format="%(asctime)s null-worker %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    cfg = args.worker
    # No compute to measure: "auto" takes the CPU default.
    budget = cfg.max_batch_tokens if isinstance(cfg.max_batch_tokens, int) else None
    engine = NullEngine.from_model(cfg.model or default_model_path(), budget, cfg.served_name)
    link = args.link
    with contextlib.suppress(KeyboardInterrupt):
        serve_worker(cfg, engine, link.broker_endpoints, liveness_of(link), security_of(link))
    return 0


if __name__ == "__main__":
    sys.exit(main())

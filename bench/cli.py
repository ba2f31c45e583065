"""``mesh-bench``: every benchmark and long-run check of embedmesh, one command.

    mesh-bench --spawn '' --mode mixed --concurrency 32 --duration 30   # = mesh-bench http ...
    mesh-bench soak --minutes 30 --out soak.json
    mesh-bench gpu-proof OUT hops,mixed

The first word picks the harness; without one (the first word is an option, or there are no
arguments at all), ``http`` runs, so every ``mesh-bench --mode ...`` line keeps working. Each harness is
imported only when it runs: ``mesh-bench http`` never imports torch, and the GPU ones need
the GPU extra. What each measures and how to run it: ``bench/README.md``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import click

DEFAULT = "http"

# name -> (module, attribute, one line of help). A click command is registered as it is; a
# function ``main(argv)`` (argparse) gets its arguments unparsed, ``--help`` included.
HARNESSES: dict[str, tuple[str, str, str]] = {
    "http": (
        "bench.http_bench",
        "main",
        "(default) Load a mesh through HTTP: closed, open, latency, mixed, hops modes, "
        "against sentence-transformers in the same run.",
    ),
    "soak": ("bench.harness.soak", "main", "A whole mesh under moderate load for long, watched."),
    "fuzz": ("bench.harness.fuzz", "main", "Hostile frames against a live broker's two sockets."),
    "rerank": (
        "bench.harness.rerank",
        "main",
        "Rerank pairs/s through HTTP beside sentence-transformers CrossEncoder.",
    ),
    "families": (
        "bench.harness.families",
        "main",
        "Per model family and output: engine alone, HTTP and sentence-transformers (GPU).",
    ),
    "gpu-engine": (
        "bench.harness.gpu_engine",
        "main",
        "The engine alone, through MeshClient and sentence-transformers, per model (GPU).",
    ),
    "attention": (
        "bench.harness.attention",
        "main",
        "Attention backends alone at each family's shapes: checked, eager and in a graph (GPU).",
    ),
    "models": (
        "bench.harness.family_models",
        "main",
        "Build random-weight model directories in real shapes (BERT-base, Qwen3-0.6B, ...).",
    ),
    "cluster": (
        "bench.cluster",
        "main",
        "A mesh across hosts from a topology file (namespaces, ssh): load from every load "
        "host, per-role figures from /metrics.",
    ),
    "index": (
        "bench.harness.index",
        "main",
        "Index the corpus xN: mesh-embed direct, --batch and an openai-client loop; live "
        "query p50/p99 meanwhile.",
    ),
    "plots": ("bench.plots", "main", "Draw a saved mesh-bench http report's PNG plots again."),
}
GPU_PROOF = Path(__file__).resolve().parent / "harness" / "gpu_proof.sh"


class Bench(click.Group):
    """Subcommands loaded on use; no subcommand name means ``http``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*HARNESSES, "gpu-proof"]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "gpu-proof":
            return gpu_proof
        if name not in HARNESSES:
            return None
        module, attr, short = HARNESSES[name]
        target = getattr(importlib.import_module(module), attr)
        if isinstance(target, click.Command):
            return target
        return _passthrough(name, target, short)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The short help from the table: listing must not import torch.
        rows = [(name, HARNESSES[name][2]) for name in HARNESSES]
        rows.append(("gpu-proof", gpu_proof.get_short_help_str(limit=90)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # http takes no positional argument: a first word that is not an option names a
        # command (a typo is refused as one, not run as http with a stray argument).
        if not args or (args[0].startswith("-") and args[0] not in _HELP):
            args = [DEFAULT, *args]
        return super().parse_args(ctx, args)


_HELP = ("--help", "-h")


def _passthrough(name: str, target: object, short: str) -> click.Command:
    """A click command that hands its arguments to an argparse ``main(argv)``."""

    def run(args: tuple[str, ...]) -> None:
        sys.exit(target(list(args)))  # type: ignore[operator]

    return click.Command(
        name,
        callback=run,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=short + " Options: mesh-bench " + name + " --help.",
        short_help=short,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.command(
    "gpu-proof",
    context_settings={"ignore_unknown_options": True},
    short_help="The GPU proof in one call: GPU tests, rerank, hops, mixed, families.",
)
@click.argument("out")
@click.argument("stages", required=False)
def gpu_proof(out: str, stages: str | None) -> None:
    """The GPU proof, from a checkout on a CUDA host: ``bench/harness/gpu_proof.sh OUT
    [STAGES]`` (STAGES: a comma list of tests, rerank, hops, mixed, models, families;
    default tests,rerank,hops). Its environment knobs are listed at the script's top."""
    if not (GPU_PROOF.parents[2] / "tests" / "gpu").is_dir():
        raise click.ClickException("gpu-proof runs from a checkout: it runs tests/gpu")
    args = ["bash", str(GPU_PROOF), out, *([stages] if stages else [])]
    sys.exit(subprocess.call(args, env=os.environ.copy()))


main = Bench(
    "mesh-bench",
    help="Every benchmark and long-run check of embedmesh, one command."
    "\n\nWithout a command name, the arguments go to 'http' (mesh-bench --mode mixed ... "
    "is mesh-bench http --mode mixed ...). Each command's options: mesh-bench COMMAND --help.",
    context_settings={"help_option_names": list(_HELP)},
)


if __name__ == "__main__":
    main()

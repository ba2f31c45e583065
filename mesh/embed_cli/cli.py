"""``mesh-embed``: the command line (click)."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
from pathlib import Path

import click

from mesh.embed_cli.batch_run import BatchRunner, errors_path_of, prepare_batch
from mesh.embed_cli.errors import EmbedError, ExitCode
from mesh.embed_cli.pipeline import Job, Runner, Summary, prepare

EPILOG = """\b
Exit status:
  0    done: OUTPUT holds every row, in input order
  1    usage or input error (a wrong option, a malformed row, OUTPUT in the way)
  2    the server refused a request (a 4xx other than 408, 409, 429); its message is printed
  3    the server stayed unavailable (429, 5xx, no connection) after --max-retries
  4    --batch: OUTPUT is written but some rows failed; they are listed, with the
       server's reasons, in OUTPUT.errors.jsonl
  130  interrupted (SIGINT or SIGTERM); the rows written are saved: rerun with --resume
"""


class Interrupted(Exception):
    """SIGINT or SIGTERM; the message says how to resume."""


@click.command(epilog=EPILOG, context_settings={"show_default": True,
                                                "help_option_names": ["-h", "--help"]})  # fmt: skip
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="OUT.npy (float32 rows), OUT.jsonl ({id, embedding} lines) or OUT.parquet "
                   "(id, embedding columns).")  # fmt: skip
@click.option("--url", required=True, envvar=["EMBEDMESH_URL", "OPENAI_BASE_URL"],
              help="The server's /v1 base, e.g. http://127.0.0.1:8000/v1 (env EMBEDMESH_URL, "
                   "then OPENAI_BASE_URL).")  # fmt: skip
@click.option("--model", required=True, help="The model's name, as the server lists it.")
@click.option("--text-field", default="text", help="The field (column) holding each text.")
@click.option("--id-field", default="id",
              help="The field carried to JSONL and Parquet output as `id` (else the row number).")  # fmt: skip
@click.option("--dimensions", type=click.IntRange(min=1), default=None,
              help="Ask for vectors of this width (Matryoshka truncation).")  # fmt: skip
@click.option("--encoding-format", type=click.Choice(["base64", "float"]), default="base64",
              help="How vectors travel; base64 is smaller and exact (as the openai client).")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 256), default=4,
              help="Requests in flight at most.")  # fmt: skip
@click.option(
    "--batch-size",
    type=click.IntRange(1, 2048),
    default=64,
    help="Texts a request (with --batch: a line of the batch).",
)
@click.option("--priority", type=click.Choice(["batch", "interactive"]), default="batch",
              help="The embedmesh lane asked for (the X-Embedmesh-Priority header): batch work "
                   "never delays live queries. Other servers ignore it.")  # fmt: skip
@click.option("--resume", is_flag=True,
              help="Continue an interrupted run from OUTPUT.progress (starts afresh if none).")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite an existing OUTPUT and start over.")
@click.option("--api-key", envvar=["EMBEDMESH_API_KEY", "OPENAI_API_KEY"], default=None,
              show_default=False,
              help="Sent as 'Authorization: Bearer KEY'. Prefer the env EMBEDMESH_API_KEY (or "
                   "OPENAI_API_KEY): argv is visible to every user.")  # fmt: skip
@click.option("--max-retries", type=click.IntRange(0, 100), default=8,
              help="Retries of one request on 429, 5xx or a failed connection.")  # fmt: skip
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=600.0,
              help="Seconds one request may take.")  # fmt: skip
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@click.option("--batch", is_flag=True,
              help="Through the server's Batch API (/files, /batches) instead of live requests: "
                   "the batches run on the server, and survive this command's end (--resume "
                   "reattaches). --concurrency does not apply.")  # fmt: skip
@click.option("--batch-file-bytes", type=click.IntRange(min=1024), default=200 * 10**6,
              help="--batch: the largest request file uploaded; more rows go to more batches.")  # fmt: skip
@click.option("--batch-rows", type=click.IntRange(min=1), default=50_000,
              help="--batch: the most rows (embedding inputs) a batch holds (OpenAI's limit).")  # fmt: skip
@click.option("--completion-window", default="24h", help="--batch: the batches' window.")
@click.option("--poll-interval", "poll_interval_s", type=click.FloatRange(min=0.05),
              default=5.0, help="--batch: the longest wait, in seconds, between two looks at "
                                "the batches (the first come faster).")  # fmt: skip
@click.option("--cancel-on-interrupt", is_flag=True,
              help="--batch: on Ctrl-C cancel the batches on the server (else they keep "
                   "running, and --resume collects them).")  # fmt: skip
@click.option("--keep-server-files", is_flag=True,
              help="--batch: keep the uploaded request files on the server at the end.")  # fmt: skip
def command(input_path: Path, output: Path, url: str, model: str, text_field: str,
            id_field: str, dimensions: int | None, encoding_format: str, concurrency: int,
            batch_size: int, priority: str, resume: bool, force: bool, api_key: str | None,
            max_retries: int, timeout_s: float, quiet: bool, batch: bool,
            batch_file_bytes: int, batch_rows: int, completion_window: str,
            poll_interval_s: float, cancel_on_interrupt: bool,
            keep_server_files: bool) -> int:  # fmt: skip
    """Embed every text of INPUT (.jsonl, .csv or .parquet) through URL's /embeddings and
    write the vectors to OUTPUT, in input order.

    Works with embedmesh and any OpenAI-compatible server. Reads and writes as a stream, so
    memory stays bounded whatever the file's size; the rows written are recorded in
    OUTPUT.progress as they become durable, and --resume finishes an interrupted run without
    starting over. Parquet needs pyarrow (pip install 'embedmesh[parquet]').
    """
    if resume and force:
        raise click.UsageError("--resume and --force exclude each other")
    job = Job(input_path, output, url, model, text_field, id_field, dimensions, encoding_format,
              concurrency, batch_size, resume, force, api_key, max_retries, timeout_s,
              priority=priority, show_progress=not quiet, batch=batch,
              batch_file_bytes=batch_file_bytes, batch_rows=batch_rows,
              completion_window=completion_window, poll_interval_s=poll_interval_s,
              cancel_on_interrupt=cancel_on_interrupt,
              keep_server_files=keep_server_files)  # fmt: skip
    try:
        summary = asyncio.run(_run(job))
    except EmbedError as exc:
        click.echo(f"mesh-embed: error: {exc.message}", err=True)
        return int(exc.code)
    except Interrupted as exc:
        click.echo(f"mesh-embed: {exc}", err=True)
        return int(ExitCode.INTERRUPTED)
    except KeyboardInterrupt:
        click.echo(f"mesh-embed: interrupted; rerun with --resume to finish {output}", err=True)
        return int(ExitCode.INTERRUPTED)
    if not quiet:
        click.echo(_summary_line(summary, output), err=True)
    if summary.failed:
        click.echo(_failed_lines(summary.failed, errors_path_of(output)), err=True)
        return int(ExitCode.PARTIAL)
    return int(ExitCode.DONE)


def _failed_lines(failed: int, errors: Path, shown: int = 5) -> str:
    """The count, the file listing every failed row, and the first few rows themselves."""
    lines = [f"mesh-embed: {failed:,} rows failed; their ids and the server's reasons are "
             f"in {errors}"]  # fmt: skip
    with errors.open("rb") as f:
        for line in itertools.islice(f, shown):
            doc = json.loads(line)
            lines.append(f"  row {doc['row'] + 1} (id {doc['id']!r}): {doc['error']}"[:300])
    if failed > shown:
        lines.append(f"  ... and {failed - shown:,} more")
    return "\n".join(lines)


def _runner(job: Job) -> Runner | BatchRunner:
    if job.batch:
        return BatchRunner(job, *prepare_batch(job))
    return Runner(job, *prepare(job))


async def _run(job: Job) -> Summary:
    runner = _runner(job)
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert task is not None
    signals: list[int] = []

    def stop(signum: int) -> None:
        signals.append(signum)
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    try:
        await runner.run()
    except asyncio.CancelledError:
        if signals:
            raise Interrupted(runner.resume_hint()) from None
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    # Outside the handlers: a cancel pending at the task's end would mark a finished run
    # cancelled. A Ctrl-C here is a KeyboardInterrupt, and --resume redoes only this step.
    return runner.finish()


def _summary_line(summary: Summary, output: Path) -> str:
    rate = summary.tokens / summary.seconds if summary.seconds > 0 else 0.0
    resumed = f" (after {summary.skipped:,} rows of an earlier run)" if summary.skipped else ""
    return (f"mesh-embed: wrote {summary.rows:,} rows to {output}{resumed}: "
            f"{summary.tokens:,} tokens in {summary.seconds:.1f} s ({rate:,.0f} tokens/s)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """The console script: click's usage errors exit 1 here (click's own default is 2, which
    this command's table gives to a server's refusal)."""
    try:
        code = command.main(args=argv, prog_name="mesh-embed", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    sys.exit(code if isinstance(code, int) else 0)

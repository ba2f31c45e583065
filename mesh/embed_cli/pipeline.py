"""One run: rows streamed from the source, a bounded window of requests in flight, vectors
written in input order, the progress file checkpointed as the output becomes durable."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mesh.embed_cli import progress
from mesh.embed_cli.client import Embedded, EmbeddingsClient
from mesh.embed_cli.errors import InputError
from mesh.embed_cli.sinks import Sink, open_sink, remove_tree
from mesh.embed_cli.sources import Row, Source, open_source

CHECKPOINT_S = 1.0  # how often the durable prefix is recorded (an fsync of the output each)


@dataclass
class Job:
    """Everything one ``mesh-embed`` run is told."""

    source: Path
    out: Path
    url: str
    model: str
    text_field: str = "text"
    id_field: str = "id"
    dimensions: int | None = None
    encoding_format: str = "base64"
    concurrency: int = 4
    batch_size: int = 64
    resume: bool = False
    force: bool = False
    api_key: str | None = None
    max_retries: int = 8
    timeout_s: float = 600
    priority: str = "batch"
    show_progress: bool = True
    batch: bool = False  # through the Batch API (batch_run), not live requests
    batch_file_bytes: int = 200 * 10**6
    batch_rows: int = 50_000
    completion_window: str = "24h"
    poll_interval_s: float = 5.0
    cancel_on_interrupt: bool = False
    keep_server_files: bool = False

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues."""
        batch = {"mode": "batch", "encoding_format": self.encoding_format} if self.batch else {}
        return progress.job_of(self.source, out=str(self.out.resolve()), model=self.model,
                               text_field=self.text_field, id_field=self.id_field,
                               dimensions=self.dimensions, **batch)  # fmt: skip


@dataclass
class Summary:
    rows: int  # written by this run
    skipped: int  # already written by the run it resumed
    tokens: int
    seconds: float
    failed: int = 0  # rows without a vector (--batch: a line the server failed)


def batched(rows: Iterable[Row], size: int) -> Iterator[tuple[list[Any], list[str]]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield [r[0] for r in chunk], [r[1] for r in chunk]


def leftovers(job: Job) -> tuple[bool, bool]:
    """(an earlier run left files, this run continues it): refuses what the options do not
    settle (files in the way without --resume or --force, a complete output)."""
    marker = progress.progress_path(job.out)
    found = [p for p in (job.out, marker, job.out.with_name(job.out.name + ".parts"),
                         job.out.with_name(job.out.name + ".batch")) if p.exists()]  # fmt: skip
    if found and not job.force and not job.resume:
        raise InputError(f"{found[0]} exists: --resume continues an interrupted run, --force "
                         "starts over")  # fmt: skip
    if found and not job.force and not marker.exists():
        raise InputError(f"{job.out} exists and has no {marker.name}: it is complete "
                         "(--force starts over)")  # fmt: skip
    return bool(found), bool(found) and not job.force


def prepare(job: Job) -> tuple[Source, Sink, progress.Progress]:
    """The source, the sink positioned where this run starts, and its progress record."""
    source = open_source(job.source, job.text_field, job.id_field)
    marker = progress.progress_path(job.out)
    found, resuming = leftovers(job)
    saved = progress.load(marker, job.identity()) if resuming else None
    sink = open_sink(job.out, total=source.count())
    if saved is not None:
        sink.resume(saved.rows, saved.sink)
        return source, sink, saved
    if found:
        sink.discard()
        remove_tree(job.out.with_name(job.out.name + ".batch"))
        job.out.with_name(job.out.name + ".errors.jsonl").unlink(missing_ok=True)  # --batch's
        marker.unlink(missing_ok=True)
    record = progress.Progress(job.identity())
    progress.save(marker, record)
    return source, sink, record


class Runner:
    """The run's state: the sink, its progress record, the bar."""

    def __init__(self, job: Job, source: Source, sink: Sink, record: progress.Progress) -> None:
        self.job, self.source, self.sink, self.record = job, source, sink, record
        self.marker = progress.progress_path(job.out)
        self.skipped, self.tokens, self.dims = record.rows, 0, job.dimensions
        self.started = time.monotonic()
        self.bar = tqdm(total=sink.total, initial=record.rows, unit="text", file=sys.stderr,
                        disable=not job.show_progress, dynamic_ncols=True,
                        mininterval=0.5)  # fmt: skip

    def resume_hint(self) -> str:
        return f"interrupted; rerun with --resume to finish {self.job.out}"

    def checkpoint(self, seal: bool = False) -> None:
        self.record.rows, self.record.sink = self.sink.sync(seal)
        progress.save(self.marker, self.record)

    def _write(self, ids: list[Any], result: Embedded) -> None:
        self.sink.write(ids, result.vectors)
        self.dims = result.vectors.shape[1]
        self.tokens += result.tokens
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self.bar.set_postfix_str(f"{self.tokens / elapsed:,.0f} tok/s", refresh=False)
        self.bar.update(len(ids))

    async def _write_head(self, window: deque[tuple[list[Any], asyncio.Task[Embedded]]]) -> None:
        """Writes the oldest request's rows once it is answered (it stays in the window until
        then, so an interruption cancels it with the others)."""
        ids, head = window[0]
        result = await head
        window.popleft()
        self._write(ids, result)

    async def run(self) -> None:
        """Sends every row and writes its vector; ``finish`` then completes the output."""
        window: deque[tuple[list[Any], asyncio.Task[Embedded]]] = deque()
        last_sync = time.monotonic()
        async with EmbeddingsClient(
            self.job.url, self.job.model, api_key=self.job.api_key,
            dimensions=self.job.dimensions, encoding_format=self.job.encoding_format,
            max_retries=self.job.max_retries, timeout_s=self.job.timeout_s,
            connections=self.job.concurrency, priority=self.job.priority,
        ) as client:  # fmt: skip
            try:
                for ids, texts in batched(self.source.rows(self.skipped), self.job.batch_size):
                    if len(window) >= self.job.concurrency:
                        await self._write_head(window)
                        if time.monotonic() - last_sync >= CHECKPOINT_S:
                            self.checkpoint()
                            last_sync = time.monotonic()
                    window.append((ids, asyncio.create_task(client.embed(texts))))
                while window:
                    await self._write_head(window)
            except BaseException:
                for _, task in window:
                    task.cancel()
                self.checkpoint(seal=True)  # first: a second Ctrl-C may cut the wait below
                await asyncio.gather(*(task for _, task in window), return_exceptions=True)
                raise
            finally:
                self.bar.close()

    def finish(self) -> Summary:
        """Completes the output (a Parquet output is joined here) and removes the progress
        file: until then, an interruption leaves a run that ``--resume`` finishes."""
        self.sink.finish(self.dims)
        self.marker.unlink()
        progress.fsync_dir(self.marker.parent)
        return Summary(self.sink.rows - self.skipped, self.skipped, self.tokens,
                       time.monotonic() - self.started)  # fmt: skip

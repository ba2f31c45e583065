"""``mesh-embed --batch``: the file through OpenAI's Batch API instead of live requests.

The input is streamed into request files (``batch_requests``), each uploaded and made a batch
as soon as it is closed; the batches are polled, with the progress bar fed by their
``request_counts`` (and embedmesh's ``tokens_done``); each finished batch's output and error
files are downloaded, streamed, and put back in row order on disk (``batch_results``); the
output is written last, in one pass.

Every step is recorded in ``OUT.progress`` before the next starts (the uploaded file ids, the
batch ids, which batches were collected), so ``--resume`` after Ctrl-C or a crash reattaches
to the batches still running on the server instead of starting over. Ctrl-C leaves them
running (``--cancel-on-interrupt`` cancels them, and ``--resume`` then submits them again).
Scratch files live in ``OUT.batch/`` until the output is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mesh.embed_cli import progress
from mesh.embed_cli.batch_http import BatchApi
from mesh.embed_cli.batch_requests import request_body, write_request_files
from mesh.embed_cli.batch_results import Ingest, Scratch, emit_span, failures_by_row
from mesh.embed_cli.errors import ServerRefused
from mesh.embed_cli.pipeline import Job, Summary, leftovers
from mesh.embed_cli.sinks import open_sink, remove_tree
from mesh.embed_cli.sources import Source, open_source

FINISHED = {"completed", "expired", "cancelled"}  # terminal with results to collect
POLL_FIRST_S = 0.25


@dataclass
class Part:
    """One request file and its batch, as ``OUT.progress`` records them."""

    index: int
    start: int
    end: int
    file_id: str | None = None
    batch_id: str | None = None
    status: str = "uploading"
    per_line: int = 1  # rows a request line carries (the last line may carry fewer)
    done: int = 0  # rows answered: request_counts.completed + failed, in rows
    tokens: int = 0
    collected: bool = False  # its results are in the scratch file


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".batch")


def prepare_batch(job: Job) -> tuple[Source, progress.Progress]:
    """The source and the progress record: an earlier ``--batch`` run's under ``--resume``."""
    source = open_source(job.source, job.text_field, job.id_field)
    open_sink(job.out, 0)  # a wrong format or directory is refused now, not after the batches
    marker = progress.progress_path(job.out)
    found, resuming = leftovers(job)
    if resuming:
        return source, progress.load(marker, job.identity())
    if found:
        open_sink(job.out, 0).discard()
        remove_tree(job.out.with_name(job.out.name + ".parts"))
        remove_tree(work_dir(job.out))
    record = progress.Progress(job.identity())
    progress.save(marker, record)
    return source, record


class BatchRunner:
    """One ``--batch`` run; ``run`` submits and collects, ``finish`` writes the output."""

    def __init__(self, job: Job, source: Source, record: progress.Progress) -> None:
        self.job, self.source, self.record = job, source, record
        self.marker = progress.progress_path(job.out)
        self.dir = work_dir(job.out)
        self.dir.mkdir(exist_ok=True)
        state = record.sink
        self.parts = [Part(**p) for p in state.get("parts", [])]
        self.dims: int | None = state.get("dims") or job.dimensions
        self.cancelled = bool(state.get("cancelled", False))
        self.total = source.count()
        self.started = time.monotonic()
        self._scratch: Scratch | None = None
        if self.dims and (self.dir / "vectors.f32").exists():  # an earlier run's collected rows
            self._scratch = Scratch(self.dir, self.total, self.dims)
        self._tokens_seen = sum(p.tokens for p in self.parts)
        self._server: dict[int, tuple[Any, Any]] = {}  # part -> (tokens/s, ETA s) it states
        self.bar = tqdm(total=self.total, unit="text", file=sys.stderr, dynamic_ncols=True,
                        disable=not job.show_progress, mininterval=0.5)  # fmt: skip

    def save(self) -> None:
        self.record.sink = {"parts": [asdict(p) for p in self.parts], "dims": self.dims,
                            "cancelled": self.cancelled}  # fmt: skip
        progress.save(self.marker, self.record)

    def scratch(self, dims: int) -> Scratch:
        if self._scratch is None:
            if self.dims is None or self.dims != dims:
                self.dims = dims
                self.save()
            self._scratch = Scratch(self.dir, self.total, dims)
        return self._scratch

    def resume_hint(self) -> str:
        live = [p.batch_id for p in self.parts if p.batch_id and not p.collected]
        again = f"rerun with --resume to finish {self.job.out}"
        if not live:
            return f"interrupted; {again}"
        if self.cancelled:
            return f"interrupted; cancelled {', '.join(live)}; {again} (submits them again)"
        return (f"interrupted; {len(live)} batch(es) keep running on the server "
                f"({', '.join(live)}): {again} when they are done, or to watch them")  # fmt: skip

    async def run(self) -> None:
        async with BatchApi(self.job.url, api_key=self.job.api_key,
                            max_retries=self.job.max_retries, timeout_s=self.job.timeout_s,
                            priority=self.job.priority) as api:  # fmt: skip
            try:
                await self._submit(api)
                await self._collect(api)
            except asyncio.CancelledError:
                if self.job.cancel_on_interrupt:
                    await self._cancel_all(api)
                raise
            finally:
                self.bar.close()
            await self._clean_server(api)

    async def _submit(self, api: BatchApi) -> None:
        """Batches for the parts that have none, then request files for the rows left."""
        # Parts are submitted in order: those without a batch are the tail; their files are
        # written again (one may have been half written), their uploads deleted.
        for part in [p for p in self.parts if p.batch_id is None]:
            if part.file_id is not None:
                await self._forget_file(api, part.file_id)
            self.parts.remove(part)
        for part in self.parts:
            if self.cancelled and not part.collected and part.batch_id is not None:
                batch = await api.retrieve(part.batch_id)
                if batch.get("status") in ("cancelling", "cancelled"):
                    await self._create(api, part)
        self.cancelled = False
        self.save()
        first = self.parts[-1].end if self.parts else 0
        texts = (text for _, text in self.source.rows(first))
        body = request_body(self.job.model, self.job.encoding_format, self.job.dimensions)
        per_line = min(self.job.batch_size, self.job.batch_rows)
        files = write_request_files(enumerate(texts, first), self.dir, body,
                                    max_bytes=self.job.batch_file_bytes,
                                    max_rows=self.job.batch_rows,
                                    first_index=len(self.parts),
                                    texts_per_line=per_line)  # fmt: skip
        for request_file in files:
            part = Part(request_file.index, request_file.start, request_file.end, per_line=per_line)
            self.parts.append(part)
            part.file_id = await api.upload(request_file.path)
            self.save()
            await self._create(api, part)
            request_file.path.unlink()

    async def _create(self, api: BatchApi, part: Part) -> None:
        assert part.file_id is not None
        meta = {"mesh_embed_input": self.job.source.name[:400], "rows": f"{part.start}-{part.end}"}
        batch = await api.create(part.file_id, self.job.completion_window, meta)
        part.batch_id, part.status, part.done = str(batch["id"]), str(batch["status"]), 0
        self.save()

    async def _collect(self, api: BatchApi) -> None:
        """Polls every uncollected batch until each has ended, collecting each as it does."""
        wait = POLL_FIRST_S
        while True:
            for part in [p for p in self.parts if not p.collected]:
                await self._poll(api, part)
            self._show()
            if all(p.collected for p in self.parts):
                return
            await asyncio.sleep(wait)
            wait = min(wait * 1.5, self.job.poll_interval_s)

    async def _poll(self, api: BatchApi, part: Part) -> None:
        assert part.batch_id is not None
        batch = await api.retrieve(part.batch_id)
        counts = batch.get("request_counts") or {}
        part.status = str(batch.get("status"))
        lines = int(counts.get("completed") or 0) + int(counts.get("failed") or 0)
        part.done = min(part.end - part.start, lines * part.per_line)
        self._tokens_seen += max(0, int(batch.get("tokens_done") or 0) - part.tokens)
        part.tokens = max(part.tokens, int(batch.get("tokens_done") or 0))
        # embedmesh's extra fields (other servers send neither): the server's own view.
        self._server[part.index] = (batch.get("tokens_per_second"), batch.get("eta_seconds"))
        if part.status == "failed":
            errors = (batch.get("errors") or {}).get("data") or []
            reasons = "; ".join(str(e.get("message")) for e in errors[:5]) or "no reason given"
            raise ServerRefused(f"batch {part.batch_id} (rows {part.start + 1}-{part.end}) "
                                f"failed: {reasons}")  # fmt: skip
        if part.status in FINISHED:
            await self._download_and_ingest(api, part, batch)

    async def _download_and_ingest(self, api: BatchApi, part: Part, batch: dict[str, Any]) -> None:
        failures = self.dir / f"failures-{part.index:05d}.jsonl"
        if self._scratch is not None:
            self._scratch.forget(part.start, part.end)
        with failures.open("wb") as failed:
            ingest = Ingest(self.scratch, (part.start, part.end), failed)
            for key in ("output_file_id", "error_file_id"):
                if file_id := batch.get(key):
                    path = self.dir / f"{key.split('_')[0]}-{part.index:05d}.jsonl"
                    await api.download(str(file_id), path)
                    ingest.file(path)
                    path.unlink()
        if self._scratch is not None:
            self._scratch.sync()
        part.tokens, part.done, part.collected = ingest.tokens, part.end - part.start, True
        self.save()

    def _show(self) -> None:
        done = sum(p.end - p.start if p.collected else p.done for p in self.parts)
        self.bar.update(max(0, min(done, self.total) - self.bar.n))
        running = [self._server.get(p.index, (None, None)) for p in self.parts if not p.collected]
        rates = [float(r) for r, _ in running if isinstance(r, int | float)]
        etas = [float(e) for _, e in running if isinstance(e, int | float)]
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = sum(rates) if rates else self._tokens_seen / elapsed
        postfix = f"{rate:,.0f} tok/s" if rate else ""
        if etas:
            postfix += f", server ETA {max(etas):,.0f} s"
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.refresh()

    async def _cancel_all(self, api: BatchApi) -> None:
        """``--cancel-on-interrupt``: cancels every running batch (best effort, quickly)."""
        for part in self.parts:
            if part.batch_id and not part.collected:
                try:
                    await asyncio.wait_for(api.cancel(part.batch_id), 10)
                except Exception:  # noqa: BLE001 - best effort: the hint names the batches
                    continue
        self.cancelled = True
        self.save()

    async def _forget_file(self, api: BatchApi, file_id: str) -> None:
        # Best effort: an upload left on the server loses nothing.
        with contextlib.suppress(Exception):
            await api.delete_file(file_id)

    async def _clean_server(self, api: BatchApi) -> None:
        """Deletes this run's uploads once every result is here (``--keep-server-files``
        keeps them); the batches' own output files stay with their batches."""
        if self.job.keep_server_files:
            return
        for part in self.parts:
            if part.file_id:
                await self._forget_file(api, part.file_id)

    def finish(self) -> Summary:
        """Writes the output in row order, the failed rows to ``OUT.errors.jsonl``."""
        sink = open_sink(self.job.out, self.total)
        sink.discard()  # an interrupted earlier finish is written again from the start
        errors_path = errors_path_of(self.job.out)
        ids = (row_id for row_id, _ in self.source.rows())
        failed = 0
        with errors_path.open("wb") as errors:
            for part in self.parts:
                failures = failures_by_row(self.dir / f"failures-{part.index:05d}.jsonl")
                failed += emit_span(self._scratch, self.dims or 0, (part.start, part.end),
                                    failures, ids, sink, errors)  # fmt: skip
        sink.finish(self.dims)
        if not failed:
            errors_path.unlink()
        if self._scratch is not None:
            self._scratch.close()
        shutil.rmtree(self.dir)
        self.marker.unlink()
        progress.fsync_dir(self.marker.parent)
        tokens = sum(p.tokens for p in self.parts)
        return Summary(self.total - failed, 0, tokens, time.monotonic() - self.started, failed)


def errors_path_of(out: Path) -> Path:
    return out.with_name(out.name + ".errors.jsonl")

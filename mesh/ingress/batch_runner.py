"""The batch runner: one asyncio task per ingress process, started and stopped with its app.

It works for every batch in the store, whichever process accepted it. Its owner id is the
host, port and process slot (``JobsConfig.owner``), the same across restarts, so at start it
frees what a killed predecessor held (``release_owner``) and that work resumes at once. Its
loop: expire and finalize now and then (cancels, windows), purge on a timer (retention),
validate what waits for validation, and keep ``CHUNKS_IN_FLIGHT`` chunks running, each with
``LINES_IN_FLIGHT`` lines on the mesh's batch lane, so the lane stays full while memory stays
bounded (a chunk's answers are held until it commits). A chunk's lease is renewed while it
runs; a cancel or an expiry stops it (``release_chunk``); a lost lease drops its work (another
process owns it now). A chunk the mesh kept failing is given back with one of its attempts
spent (``fail_chunk``), unless the mesh never took its line at all (no worker serves the model
now, no room: 503, 429): then it goes back unspent and this process claims nothing for
``UNAVAILABLE_PAUSE_S``, so an outage fails no line; the batch's window bounds the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator

from aiohttp import web

from mesh.ingress.batch_lines import ChunkFailed, run_line, validate
from mesh.ingress.batch_store import JOBS, Jobs
from mesh.ingress.config import JobsConfig
from mesh.ingress.state import STATE, IngressState
from mesh.jobs import Batch, BatchError, JobStore, Lease, LeaseLost, LineResult, NotFound
from mesh.jobs.store import DEFAULT_LEASE_S

log = logging.getLogger("embedmesh.batches")

CHUNK_LINES = 100  # input lines per chunk (lease and retry unit); 10..1000 is reasonable
# A chunk's answers are held until it commits: a file whose lines carry many inputs each is cut
# into chunks of about this many inputs (on average), fewer lines a chunk.
CHUNK_INPUTS = 6400
# A small batch is cut finer, into about this many chunks of at least MIN_CHUNK_LINES: its
# work spreads over processes and its request_counts move while it runs.
MIN_CHUNKS = 8
MIN_CHUNK_LINES = 10
CHUNKS_IN_FLIGHT = 2  # per process: one running, one ready behind it
LINES_IN_FLIGHT = 8  # per chunk: requests on the mesh at once
POLL_S = 0.5  # the loop's pause when there is nothing to claim
SWEEP_S = 5.0  # expire and finalize this often (a cancel with no chunk to commit ends here)
PURGE_S = 600.0  # delete the files whose retention passed this often
RETRY_S = 5.0  # the pause after the store failed a step
# After a chunk the mesh could not take (no worker for a model, no room), no claim for this
# long: the chunk goes back unspent, and claiming it again at once would only spin.
UNAVAILABLE_PAUSE_S = 10.0
RENEW_S = DEFAULT_LEASE_S / 3


class BatchRunner:
    def __init__(self, state: IngressState, jobs: Jobs) -> None:
        self.state = state
        self.jobs = jobs
        self.owner = jobs.cfg.owner
        self.chunks: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        self._swept = self._purged = 0.0
        self.paused_until = 0.0  # monotonic: no claims before it (UNAVAILABLE_PAUSE_S)

    async def run(self) -> None:
        while not self.jobs.exists():  # SQLite: nothing to do until the first upload
            await asyncio.sleep(POLL_S)
        store = await self._open()
        while True:
            try:
                busy = await self._step(store)
            except Exception:
                log.exception("batch runner %s: a step failed; going on", self.owner)
                await asyncio.sleep(RETRY_S)  # a database that is down is not asked 2x a second
                busy = False
            if not busy:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), POLL_S)

    async def _open(self) -> JobStore:
        """The store, with what a killed predecessor of this owner id held freed; retried
        while the database cannot be reached."""
        while True:
            try:
                store = await self.jobs.store()
                freed = await self.jobs.run(store.release_owner, self.owner)
            except Exception as exc:
                log.warning("batch runner %s: no store yet (%s); retrying", self.owner, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if freed:
                log.info("batch runner %s: resumed %d chunks its predecessor held", self.owner,
                         freed)  # fmt: skip
            return store

    async def _step(self, store: JobStore) -> bool:
        now = time.monotonic()
        if now - self._swept >= SWEEP_S:
            self._swept = now
            self.jobs.progress.update(await self.jobs.run(_sweep, store))
        if now - self._purged >= PURGE_S:
            self._purged = now
            purged = await self.jobs.run(store.purge)
            if purged:
                log.info("purged %d files past their retention", len(purged))
        batch = await self.jobs.run(store.claim_validation, self.owner)
        if batch is not None:
            await self.jobs.run(_validate, store, batch, self.owner)
            return True
        claimed = False
        # No catalog yet (a fresh process, a restarted broker): every line would be a 404.
        ready = self.state.client.models() and now >= self.paused_until
        while ready and len(self.chunks) < CHUNKS_IN_FLIGHT:
            lease = await self.jobs.run(store.claim_chunk, self.owner)
            if lease is None:
                break
            task = asyncio.create_task(self._chunk(store, lease))
            self.chunks.add(task)
            task.add_done_callback(self._chunk_done)
            claimed = True
        return claimed

    def _chunk_done(self, task: asyncio.Task[None]) -> None:
        self.chunks.discard(task)
        self.wake.set()

    async def _chunk(self, store: JobStore, lease: Lease) -> None:
        current = lease
        work: asyncio.Task[list[LineResult]] | None = None
        try:
            lines = await self.jobs.run(store.read_chunk, lease)
            work = asyncio.create_task(self._lines(lease, lines))
            while not (await asyncio.wait({work}, timeout=RENEW_S))[0]:
                current = await self.jobs.run(store.renew, current)
                if current.cancel_requested:  # cancelled, or past its window: stop here
                    work.cancel()
                    await self.jobs.run(store.release_chunk, current)
                    return
            await self.jobs.run(store.complete_chunk, current, work.result())
        except ChunkFailed as exc:
            log.warning("batch %s chunk %d failed: %s", lease.batch_id, lease.chunk_no, exc)
            with contextlib.suppress(LeaseLost):
                if exc.unavailable:  # the mesh's outage, not the lines': no attempt spent
                    self.paused_until = time.monotonic() + UNAVAILABLE_PAUSE_S
                    await self.jobs.run(store.release_chunk, current)
                else:
                    await self.jobs.run(store.fail_chunk, current, str(exc))
        except LeaseLost:
            log.info("batch %s chunk %d: lease lost", lease.batch_id, lease.chunk_no)
        except asyncio.CancelledError:
            # Stopping: give the chunk back now rather than when its lease runs out.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.jobs.run(store.release_chunk, current))
            raise
        except Exception:
            log.exception("batch %s chunk %d", lease.batch_id, lease.chunk_no)
            with contextlib.suppress(Exception):
                await self.jobs.run(store.fail_chunk, current, "the runner failed on it")
        finally:
            if work is not None:
                work.cancel()  # a no-op once it is done

    async def _lines(self, lease: Lease, lines: list[bytes]) -> list[LineResult]:
        gate = asyncio.Semaphore(LINES_IN_FLIGHT)

        async def one(line_no: int, raw: bytes) -> LineResult:
            async with gate:
                return await run_line(self.state, line_no, raw)

        first = lease.span.first_line
        tasks = [asyncio.create_task(one(first + i, raw)) for i, raw in enumerate(lines)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def stop(self) -> None:
        for task in list(self.chunks):
            task.cancel()
        await asyncio.gather(*self.chunks, return_exceptions=True)


def chunk_lines(lines: int, inputs: int = 0) -> int:
    """Lines per chunk of a batch of ``lines`` asking for ``inputs`` embeddings: CHUNK_LINES,
    fewer for a small batch, and fewer where the lines carry many inputs (CHUNK_INPUTS)."""
    n = max(MIN_CHUNK_LINES, min(CHUNK_LINES, -(-lines // MIN_CHUNKS)))
    if inputs > 0 and lines > 0:
        n = min(n, max(1, CHUNK_INPUTS * lines // inputs))
    return n


def _sweep(store: JobStore) -> list[Batch]:
    """Expire and finalize what is due; each unfinished batch as it is after that."""
    store.expire()
    return [store.finalize(batch_id) for batch_id in store.unfinished_batches()]


def _validate(store: JobStore, batch: Batch, owner: str) -> None:
    """Check the input file; start the batch on it, or fail it with the errors. The
    validation lease is renewed while it reads (a 200 MB file takes a while); an input file
    that is gone (deleted, its blob missing) fails the batch at once, where retrying would
    only fail again until the batch's window ends. Any other error reading it (a full file
    table, a shared volume's hiccup) goes up: the lease lapses and validation is tried
    again."""
    try:
        with store.open_file(batch.input_file_id) as src:
            lines = _renewing(iter(src), lambda: store.renew_validation(batch.id, owner))
            errors, tokens, inputs = validate(lines, batch.endpoint)
    except LeaseLost as exc:
        log.info("batch %s: validation given up: %s", batch.id, exc)
        return
    except (FileNotFoundError, NotFound) as exc:
        log.warning("batch %s: its input file is gone: %s", batch.id, exc)
        errors, tokens, inputs = [_unreadable(batch.input_file_id, exc)], 0, 0
    try:
        if errors:
            store.renew_validation(batch.id, owner)  # still this process's to fail
            store.fail_batch(batch.id, errors)
            log.info("batch %s failed validation: %s", batch.id, errors[0].message)
            return
        store.renew_validation(batch.id, owner)  # cutting a large file into chunks reads it
        chunks = store.plan_chunks(batch.input_file_id, CHUNK_LINES)
        lines_total = chunks[-1].end_line if chunks else 0
        size = chunk_lines(lines_total, inputs)
        if size < CHUNK_LINES:  # a small file, or lines of many inputs: a second pass
            chunks = store.plan_chunks(batch.input_file_id, size)
        store.start_batch(batch.id, chunks, tokens_total=tokens)
    except Exception as exc:  # cancelled meanwhile, or another validator won: theirs now
        log.info("batch %s: not started: %s", batch.id, exc)


def _renewing(lines: Iterator[bytes], renew: Callable[[], None]) -> Iterator[bytes]:
    """``lines``, calling ``renew`` every RENEW_S seconds while they are read."""
    due = time.monotonic() + RENEW_S
    for n, line in enumerate(lines):
        if n % 1024 == 0 and time.monotonic() >= due:
            renew()
            due = time.monotonic() + RENEW_S
        yield line


def _unreadable(file_id: str, exc: BaseException) -> BatchError:
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return BatchError(
        "input_file_unreadable",
        f"the input file {file_id} cannot be read ({why}); upload it again and create a new batch",
    )


def attach(app: web.Application, cfg: JobsConfig | None) -> None:
    """Give the app its store handle, the batch gauges and the runner (with ``cfg``: none
    without it). Call it after the client's cleanup context: the runner needs the client."""
    if cfg is None:
        return
    jobs = app[JOBS] = Jobs(cfg)
    app[STATE].metrics.exposed.register(jobs.progress)
    app.cleanup_ctx.append(_lifetime)


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context: the runner runs while the app serves (after the client
    starts, before it closes)."""
    jobs = app[JOBS]
    runner = BatchRunner(app[STATE], jobs)
    task = asyncio.create_task(runner.run())
    yield
    task.cancel()
    await runner.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await jobs.close()

"""An upload's body, streamed from the event loop to a store thread, within the process's
share of ``--max-state-bytes``.

The store writes on an upload thread (``Jobs.upload``) and pulls each block from the loop:
:class:`PartStream`. Each block is counted in the process's :class:`UploadRoom` as it arrives
(:class:`Quota`); the block that would pass the limit raises :class:`StorageFull` and the
upload's bytes go back at once. The accounting ends on the upload thread, when the store is
done with the stream, whatever happened to the request meanwhile. A request that ends while
its thread waits for a block (a 408, a client gone, a stop) aborts the stream, so that thread
never waits on a loop that will not answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from aiohttp import BodyPartReader

T = TypeVar("T")

BLOCK = 1 << 20
WAIT_S = 1.0  # how often a waiting read checks that its request still runs


class UploadRoom:
    """This process's uploads: the bytes they are writing and those they finished writing, so
    that uploads at once share ``--max-state-bytes`` instead of each taking the room it saw at
    its start, and the upload threads they hold. The bound is exact within a process;
    processes uploading at the same moment each count the others' files only once stored."""

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self.slots = slots  # upload threads; an upload past them is refused, not queued
        self.busy = 0
        self.writing = 0  # bytes of uploads in progress
        self.written = 0  # bytes of finished uploads, ever (a mark subtracts what it saw)

    def claim_slot(self) -> bool:
        with self._lock:
            if self.busy >= self.slots:
                return False
            self.busy += 1
            return True

    def free_slot(self) -> None:
        with self._lock:
            self.busy -= 1

    def used_since(self, mark: int) -> int:
        """Bytes in flight plus those stored by this process since ``mark`` (``written``)."""
        with self._lock:
            return self.writing + self.written - mark

    def take(self, n: int, limit: int, base: int, mark: int) -> bool:
        """Count ``n`` more bytes in flight if ``base`` plus this process's bytes since
        ``mark`` stay within ``limit``; False (nothing counted) if they would not."""
        with self._lock:
            if base + self.writing + self.written - mark + n > limit:
                return False
            self.writing += n
            return True

    def end(self, n: int, stored: bool) -> None:
        with self._lock:
            self.writing -= n
            if stored:
                self.written += n


class StorageFull(Exception):
    """The upload would take the state past ``--max-state-bytes``."""


class UploadAborted(Exception):
    """The request the upload belongs to ended while its thread waited for a block."""


class Quota:
    """One upload's share of ``--max-state-bytes``: the room left when it started (what the
    store held then, ``base``) less what this process's uploads wrote since ``mark``."""

    def __init__(self, room: UploadRoom, limit: int, base: int, mark: int) -> None:
        self.room = room
        self.limit = limit
        self.base = base
        self.mark = mark  # room.written before the store was asked: nothing falls between
        self.taken = 0

    def full(self) -> bool:
        return self.base + self.room.used_since(self.mark) >= self.limit

    def take(self, n: int) -> None:
        if not self.room.take(n, self.limit, self.base, self.mark):
            self.end(False)  # its room goes back now, before the other uploads' next blocks
            raise StorageFull
        self.taken += n

    def end(self, stored: bool) -> None:
        self.room.end(self.taken, stored)
        self.taken = 0


class PartStream:
    """A multipart part read as a blocking file by the store's thread: each ``read`` waits
    for the event loop to receive the next block; ``abort`` (from the loop) ends a wait."""

    def __init__(
        self, part: BodyPartReader, loop: asyncio.AbstractEventLoop, quota: Quota | None
    ) -> None:
        self.part = part
        self.loop = loop
        self.quota = quota
        self.aborted = False
        self._pending: concurrent.futures.Future[bytes] | None = None

    def read(self, size: int = BLOCK) -> bytes:
        if self.aborted:
            raise UploadAborted
        future = asyncio.run_coroutine_threadsafe(self.part.read_chunk(size), self.loop)
        self._pending = future
        while True:
            try:
                block = future.result(WAIT_S)
                break
            except concurrent.futures.TimeoutError:
                if self.aborted or self.loop.is_closed():
                    future.cancel()
                    raise UploadAborted from None
            except concurrent.futures.CancelledError:
                raise UploadAborted from None
        if self.quota is not None:
            self.quota.take(len(block))
        return block

    def abort(self) -> None:
        self.aborted = True
        if self._pending is not None:
            self._pending.cancel()


def write_on_thread(
    stream: PartStream, room: UploadRoom, write: Callable[[PartStream], T]
) -> Callable[[], T]:
    """What the upload thread runs: ``write(stream)``, then the upload's accounting ended
    there (stored or not) and its thread slot given back."""

    def run() -> T:
        stored = False
        try:
            made = write(stream)
            stored = True
            return made
        finally:
            if stream.quota is not None:
                stream.quota.end(stored)
            room.free_slot()

    return run

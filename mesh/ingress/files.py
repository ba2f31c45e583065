"""OpenAI's Files API for batch input: ``POST /v1/files`` (multipart, ``purpose=batch``),
``GET /v1/files``, ``GET /v1/files/{file_id}``, ``GET /v1/files/{file_id}/content`` and
``DELETE /v1/files/{file_id}``.

An upload streams from the socket to the store's blob in 1 MiB blocks (the store writes on an
upload thread, pulling each block from the event loop), so a 200 MB file never sits in memory; the
content of a file (an output file may be GBs) streams back the same way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import BinaryIO, cast

from aiohttp import BodyPartReader, web

from mesh.ingress.batch_store import (
    Jobs,
    invalid,
    jobs_of,
    page_args,
    store_unavailable,
    unreachable,
)
from mesh.ingress.http_errors import ApiError
from mesh.ingress.state import json_response
from mesh.ingress.uploads import BLOCK, PartStream, Quota, StorageFull, write_on_thread
from mesh.jobs import FileObject, FilePurpose, Page, TooLarge

INSUFFICIENT_STORAGE = 507
# The upload route: its body only has to keep arriving (mesh.ingress.server's body timeout).
UPLOAD_PATH = "/v1/files"
UPLOAD_RETRY_S = 5  # Retry-After when every upload thread is busy

log = logging.getLogger("embedmesh.batches")


def add_routes(app: web.Application) -> None:
    app.router.add_post(UPLOAD_PATH, _upload)
    app.router.add_get("/v1/files", _list)
    app.router.add_get("/v1/files/{file_id}", _get)
    app.router.add_get("/v1/files/{file_id}/content", _content)
    app.router.add_delete("/v1/files/{file_id}", _delete)


async def _upload(request: web.Request) -> web.Response:
    jobs = jobs_of(request)
    if not request.content_type.startswith("multipart/"):
        raise invalid("upload the file as multipart/form-data with fields 'file' and 'purpose'")
    reader = await request.multipart()
    purpose: str | None = None
    made = None
    try:
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = (await part.text()).strip()
                if made is None:
                    _check_purpose(purpose)  # before the file: refused before it is stored
            elif part.name == "file" and made is None:
                made = await _store_part(jobs, part, part.filename or "upload.jsonl")
            else:
                await part.release()
        if made is None:
            raise invalid("the form has no 'file' part", "file")
        if purpose is None:
            raise invalid("the form has no 'purpose' field; it must be 'batch'", "purpose")
        _check_purpose(purpose)
    except ApiError:  # stored, but the form is wrong: its id reaches no one
        if made is not None:
            stored = made
            await jobs.call(lambda s: s.delete_file(stored.id))
        raise
    except BaseException:  # a 408 on its tail, a client gone, a stop: the same, in the back
        if made is not None:
            _forget(jobs, made.id)
        raise
    return json_response(made.to_openai())


_FORGETTING: set[asyncio.Task[None]] = set()


def _forget(jobs: Jobs, file_id: str) -> None:
    """Delete ``file_id`` in the background (the request may be being cancelled)."""

    async def delete() -> None:
        try:
            await jobs.call(lambda s: s.delete_file(file_id))
        except Exception:
            log.warning("could not delete the unanswered upload %s", file_id, exc_info=True)

    task = asyncio.get_running_loop().create_task(delete())
    _FORGETTING.add(task)
    task.add_done_callback(_FORGETTING.discard)


def _check_purpose(purpose: str) -> None:
    if purpose != FilePurpose.BATCH:
        raise invalid(f"'purpose' must be 'batch' on this server; got {purpose!r}", "purpose")


async def _store_part(jobs: Jobs, part: BodyPartReader, filename: str):  # noqa: ANN202
    cfg = jobs.cfg
    quota = None
    if cfg.max_state_bytes:
        mark = jobs.room.written
        used = await jobs.call(lambda s: s.stored_bytes(), create=True)
        quota = Quota(jobs.room, cfg.max_state_bytes, used, mark)
        if quota.full():
            raise _storage_full(cfg.max_state_bytes)
    store = await jobs.store()
    if not jobs.room.claim_slot():  # every upload thread busy: refused now, not queued
        raise ApiError(
            503, f"{jobs.room.slots} uploads are in progress on this server process; retry "
            "shortly", "server_error", "unavailable", retry_after_s=UPLOAD_RETRY_S,
        )  # fmt: skip
    stream = PartStream(part, asyncio.get_running_loop(), quota)

    def write(source: PartStream) -> FileObject:
        return store.create_file(
            cast("BinaryIO", source),
            filename=filename,
            purpose=FilePurpose.BATCH,
            max_bytes=cfg.max_file_bytes,
        )

    try:
        return await jobs.upload(write_on_thread(stream, jobs.room, write))
    except StorageFull:
        raise _storage_full(cfg.max_state_bytes) from None
    except TooLarge:
        raise ApiError.too_large(
            f"the file is over the limit of {cfg.max_file_bytes} bytes (--max-batch-file-bytes)",
            "file",
        ) from None
    except Exception as exc:
        if unreachable(exc):
            raise store_unavailable(exc) from None
        raise
    finally:
        stream.abort()  # a thread still waiting for a block stops waiting (a no-op after)


def _storage_full(limit: int) -> ApiError:
    return ApiError(
        INSUFFICIENT_STORAGE,
        f"the server's batch storage is full ({limit} bytes, --max-state-bytes): delete files "
        "(DELETE /v1/files/{file_id}) or wait for finished batches' files to expire",
        "server_error",
        "storage_full",
    )


async def _list(request: web.Request) -> web.Response:
    limit, after = page_args(request)
    purpose = request.query.get("purpose") or None
    jobs = jobs_of(request)
    if not jobs.exists() and after is None:
        return json_response(Page().to_openai())
    page = await jobs.call(lambda s: s.list_files(purpose=purpose, limit=limit, after=after))
    return json_response(page.to_openai())


async def _get(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    made = await jobs_of(request).call(lambda s: s.get_file(file_id))
    return json_response(made.to_openai())


async def _content(request: web.Request) -> web.StreamResponse:
    jobs = jobs_of(request)
    file_id = request.match_info["file_id"]
    made = await jobs.call(lambda s: s.get_file(file_id))
    src: BinaryIO = await jobs.call(lambda s: s.open_file(file_id))
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Disposition": "attachment; filename=" + _quoted(made.filename),
            }
        )
        response.content_length = made.bytes
        await response.prepare(request)
        while block := await jobs.run(src.read, BLOCK):
            await response.write(block)
        await response.write_eof()
        return response
    finally:
        await jobs.run(src.close)


def _quoted(filename: str) -> str:
    return '"' + "".join(c for c in filename if c.isprintable() and c not in '"\\') + '"'


async def _delete(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    await jobs_of(request).call(lambda s: s.delete_file(file_id))
    return json_response({"id": file_id, "object": "file", "deleted": True})

"""Turning queue slices into a BATCH message, and a BATCH_RESULT back into per-request rows."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields

import numpy as np

from mesh.broker.queue import Slice
from proto_msgs import BatchAssign, BatchResult, OutputOptions, RequestResult, SubmitRequest

MAX_WORKER_TIMINGS = 16  # named durations of a BatchResult forwarded in each RequestResult


@dataclass(slots=True)
class BatchPlan:
    """A sent batch: its message and where each slice's rows land in the result groups."""

    message: BatchAssign
    slices: list[Slice]
    groups: list[int]  # output group of each slice
    rows: list[int]  # first row of each slice within its group's array
    # Rows of each slice: its sequences, or the spans of its sequences for a span request.
    counts: list[int]

    def split(self, embeddings: list[np.ndarray]) -> list[tuple[Slice, np.ndarray]]:
        """Each slice with its rows (views, no copy); ValueError if the shapes are off."""
        expected = [0] * len(self.message.outputs)
        for group, count in zip(self.groups, self.counts, strict=True):
            expected[group] += count
        if len(embeddings) != len(expected) or any(
            len(e) != n for e, n in zip(embeddings, expected, strict=True)
        ):
            raise ValueError(f"result rows {[len(e) for e in embeddings]}, expected {expected}")
        return [
            (piece, embeddings[group][row : row + count])
            for piece, group, row, count in zip(
                self.slices, self.groups, self.rows, self.counts, strict=True
            )
        ]


def span_rows(submit: SubmitRequest, start: int, end: int) -> np.ndarray | None:
    """int32 ``[k + 1]``: where the rows of sequences ``start..end`` of a span request begin,
    from 0 (``RequestResult.row_offsets``); None for a request of one row per sequence."""
    if submit.span_offsets is None:
        return None
    part = submit.span_offsets[start : end + 1]
    return part - part[0]


def _options_key(opt: OutputOptions) -> tuple[object, ...]:
    # Every field: requests whose outputs differ in anything (dims, prompt skip, sparse top_k,
    # ...) are post-processed differently, so never one group; a field added later is too.
    return tuple(getattr(opt, f.name) for f in fields(opt))


def plan_batch(batch_id: int, model: str, slices: list[Slice], timeout_s: float) -> BatchPlan:
    """Concatenate the token ids of ``slices`` (whose payloads are SubmitRequests)."""
    if len(slices) == 1:
        submit = slices[0].request.payload
        if (
            isinstance(submit, SubmitRequest)
            and submit.span_offsets is None
            and submit.spans is None
        ):
            return _plan_one(batch_id, model, slices[0], submit, timeout_s)
    outputs: list[OutputOptions] = []
    group_of: dict[tuple[object, ...], int] = {}
    groups: list[int] = []
    rows: list[int] = []
    counts: list[int] = []
    span_parts: list[np.ndarray] = []
    span_counts: list[np.ndarray] = []
    spanned = False
    next_row: list[int] = []
    id_parts: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    index_parts: list[np.ndarray] = []
    pair_parts: list[np.ndarray] = []
    pairs = False
    for piece in slices:
        submit: SubmitRequest = piece.request.payload  # type: ignore[assignment]
        key = _options_key(submit.output)
        group = group_of.get(key)
        if group is None:
            group = group_of[key] = len(outputs)
            outputs.append(submit.output)
            next_row.append(0)
        groups.append(group)
        rows.append(next_row[group])
        n = piece.end - piece.start
        # A span request's spans are relative to their sequence: they follow it unchanged.
        starts_at = span_rows(submit, piece.start, piece.end)
        if starts_at is None or submit.spans is None or submit.span_offsets is None:
            count = n
            span_counts.append(np.zeros(n, np.int32))
        else:
            spanned = True
            count = int(starts_at[-1])
            first = int(submit.span_offsets[piece.start])
            span_parts.append(submit.spans[first : first + count])
            span_counts.append(np.diff(starts_at))
        counts.append(count)
        next_row[group] += count
        offs = submit.offsets
        id_parts.append(submit.token_ids[offs[piece.start] : offs[piece.end]])
        length_parts.append(piece.request.lengths[piece.start : piece.end])  # diffed at submit
        index_parts.append(np.full(n, group, dtype=np.int32))
        # A pair's split is relative to its own sequence: the slice carries over as it is.
        starts = submit.segment_b_start
        pairs = pairs or starts is not None
        part = np.zeros(n, np.int32) if starts is None else starts[piece.start : piece.end]
        pair_parts.append(part)
    offsets = np.zeros(sum(len(p) for p in length_parts) + 1, dtype=np.int32)
    np.cumsum(np.concatenate(length_parts), out=offsets[1:])
    span_offsets = None
    if spanned:
        span_offsets = np.zeros(len(offsets), dtype=np.int32)
        np.cumsum(np.concatenate(span_counts), out=span_offsets[1:])
    message = BatchAssign(
        batch_id=batch_id,
        model=model,
        timeout_ms=max(1, int(timeout_s * 1000)),
        outputs=outputs,
        output_index=np.concatenate(index_parts),
        token_ids=np.concatenate(id_parts).astype(np.int32, copy=False),
        offsets=offsets,
        segment_b_start=np.concatenate(pair_parts) if pairs else None,
        spans=np.concatenate(span_parts) if spanned else None,
        span_offsets=span_offsets,
    )
    return BatchPlan(message=message, slices=slices, groups=groups, rows=rows, counts=counts)


def _plan_one(
    batch_id: int, model: str, piece: Slice, submit: SubmitRequest, timeout_s: float
) -> BatchPlan:
    """``plan_batch`` of one slice without spans (an idle query's batch, every time): views
    of the request's arrays instead of concatenations of one part each; the same message."""
    start, end = piece.start, piece.end
    n = end - start
    offs = submit.offsets
    first = int(offs[start])
    offsets = offs[start : end + 1].astype(np.int32, copy=False)
    if first:
        offsets = offsets - np.int32(first)
    starts = submit.segment_b_start
    message = BatchAssign(
        batch_id=batch_id,
        model=model,
        timeout_ms=max(1, int(timeout_s * 1000)),
        outputs=[submit.output],
        output_index=np.zeros(n, dtype=np.int32),
        token_ids=submit.token_ids[first : int(offs[end])].astype(np.int32, copy=False),
        offsets=offsets,
        segment_b_start=None if starts is None else starts[start:end],
        spans=None,
        span_offsets=None,
    )
    return BatchPlan(message=message, slices=[piece], groups=[0], rows=[0], counts=[n])


def result_chunks(
    plan: BatchPlan, msg: BatchResult, dispatched_at: float, sent_at: float, received: float
) -> Iterator[tuple[Slice, RequestResult]]:
    """One RequestResult per slice of a live request, built as it is consumed (so each chunk's
    "broker_out" counts the chunks sent before it); ValueError at once if the shapes are off.

    ``dispatched_at`` is on the queue's clock; ``sent_at`` and ``received`` (the batch left,
    its result arrived) are ``time.perf_counter()`` stamps, as is each request's ``received_at``.
    """
    chunks = plan.split(msg.embeddings)
    hops = _sane_hops(msg.timings)
    worker_ms = (received - sent_at) * 1000

    def build() -> Iterator[tuple[Slice, RequestResult]]:
        for piece, rows in chunks:
            request = piece.request
            if not request.live:
                continue  # cancelled, expired or failed meanwhile: already answered
            indices = np.arange(piece.start, piece.end, dtype=np.int32)
            # Queue wait counts from submission, so a requeued slice reports it all.
            queue_ms = (dispatched_at - request.submitted_at) * 1000
            timings = {
                **hops,
                "broker_queue": (sent_at - request.received_at) * 1000,
                "broker_worker": worker_ms,
                "broker_out": (time.perf_counter() - received) * 1000,
            }
            cid = request.key[1]
            submit: SubmitRequest = request.payload  # type: ignore[assignment]
            row_offsets = span_rows(submit, piece.start, piece.end)
            yield (
                piece,
                RequestResult(
                    cid,
                    piece.tokens,
                    indices,
                    rows,
                    queue_ms,
                    msg.compute_ms,
                    timings,
                    row_offsets,
                ),  # fmt: skip
            )

    return build()


def _sane_hops(timings: dict[str, float]) -> dict[str, float]:
    """The worker's own hops worth forwarding: a sane few (a peer sets their number), each
    named like an identifier and a finite number. The ingress writes them into a response
    header, where a peer's CR/LF, ',' or '=' in a name would cut the connection or the list."""
    if len(timings) > MAX_WORKER_TIMINGS:
        return {}
    return {
        name: ms
        for name, ms in timings.items()
        if name.isascii() and name.isidentifier() and math.isfinite(ms)
    }

"""Refuse, before tokenizing, what the broker would refuse for lack of time.

The broker admits a request only if the work queued ahead of it in its lane, plus its own, can
be done within its deadline at its workers' rate (``mesh.broker.queue``). Every Pong carries
that backlog in seconds per model and lane and the rate (``BrokerStats.backlog_s``,
``drain_rate``), so a client can see, before spending a tokenizer thread on a request, that it
would come too late: then it answers 429 at once. A text request's own size is taken as a lower
bound (each whitespace-separated word is at least one token), the backlog is at most one ping
interval old, and the broker's check stays the exact one: this only refuses early what the
broker would refuse late.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mesh.client.request import INTERACTIVE_MAX_TOKENS, lane_for
from mesh.errors import Overloaded
from proto_msgs import BrokerStats, Lane

# Words are counted in at most this many characters of a request: a prefix's words are a lower
# bound of the whole's, and a 10 MB body must not cost the event loop a full split (32 KB split
# in about 0.6 ms here).
_SCAN_CHARS = 32 * 1024


def text_floor(
    inputs: Sequence[str | tuple[str, str]], chosen: int | None, max_tokens: int | None = None
) -> tuple[Lane, int]:
    """A lower bound of a text request's tokens before tokenizing it, and the lane it will
    surely wait in at least as long as: the chosen one, BATCH when the bound passes
    INTERACTIVE_MAX_TOKENS, else INTERACTIVE (whose backlog is the smaller).

    ``inputs``: texts, or (query, passage) pairs, whose words are counted without joining
    them. ``max_tokens``: the model's limit; an input counts for at most that many (with
    truncation a long text costs no more; without it the broker never sees it)."""
    words, left = 0, _SCAN_CHARS
    cap = max_tokens if max_tokens and max_tokens > 0 else None
    for item in inputs:
        parts = (item,) if isinstance(item, str) else item
        count = 0
        for part in parts:
            count += len(part[:left].split())
            left -= min(left, len(part))
        count = max(1, count)  # every input is at least one token
        words += min(count, cap) if cap else count
        if left == 0:
            break
    words = max(words, len(inputs))
    if chosen is not None:
        return lane_for(0, chosen), words
    return (Lane.BATCH if words > INTERACTIVE_MAX_TOKENS else Lane.INTERACTIVE), words


def may_refuse(
    stats: Iterable[BrokerStats | None], model: str, tokens_at_most: int, timeout_s: float
) -> bool:
    """Whether :func:`check_backlog` could refuse a request of at most ``tokens_at_most``
    tokens in either lane. False when some serving broker's backlog is unknown, or when at
    some broker even that many tokens behind the larger of its two lanes' backlogs would end
    in time: then no size and no lane is refused, and the floor need not be counted (a
    bulk request's word count was a quarter of the ingress loop's own CPU, profiled)."""
    seen = False
    for s in stats:
        backlog = s.backlog_s.get(model) if s is not None else None
        rate = s.drain_rate.get(model, 0.0) if s is not None else 0.0
        if backlog is None or len(backlog) != 2 or rate <= 0.0:
            return False
        if max(backlog) + tokens_at_most / rate <= timeout_s:
            return False
        seen = True
    return seen


def check_backlog(
    stats: Iterable[BrokerStats | None], model: str, lane: Lane, tokens: int, timeout_s: float
) -> None:
    """Raise Overloaded when at every broker serving ``model`` a ``lane`` request of at least
    ``tokens`` tokens would finish after ``timeout_s`` (``stats``: theirs, None = not known)."""
    finishes = []
    for s in stats:
        backlog = s.backlog_s.get(model) if s is not None else None
        rate = s.drain_rate.get(model, 0.0) if s is not None else 0.0
        if backlog is None or len(backlog) != 2 or rate <= 0.0:
            return  # a broker whose backlog is unknown might take it
        ahead = backlog[int(lane)]
        if ahead <= 0.0:
            return  # nothing ahead: the broker gives a request alone its chance
        finishes.append((ahead + tokens / rate, ahead))
    if not finishes:
        return
    finish, ahead = min(finishes)
    if finish > timeout_s:
        raise Overloaded(
            f"model {model!r} is overloaded: about {ahead:.1f}s of work is queued ahead of this"
            f" request, which would end after its {timeout_s:g}s timeout; retry later",
            retry_after_s=max(1.0, finish - timeout_s),
        )

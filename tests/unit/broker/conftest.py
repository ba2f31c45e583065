from __future__ import annotations

import itertools

import pytest

from mesh.broker.queue import Lane, Request


@pytest.fixture
def make_request():
    """Build a Request with a fresh correlation id; ``lengths`` is tokens per sequence."""
    cids = itertools.count(1)

    def make(
        lengths,
        *,
        lane: Lane = Lane.INTERACTIVE,
        model: str = "m",
        deadline: float | None = None,
        at: float = 0.0,
        key: tuple[bytes, int] | None = None,
    ) -> Request:
        return Request(
            key=key or (b"ingress", next(cids)),
            model=model,
            lane=lane,
            lengths=lengths,
            deadline=deadline,
            submitted_at=at,
        )

    return make

"""Which connection each worker talks over, and which of those connections closed.

A worker whose process dies on a reachable host has its connection closed by that host's
kernel: the broker's socket monitor sees the disconnect at once, so the worker is buried then
instead of one liveness window later. A silent partition closes nothing; the liveness window
still finds those. A ROUTER's messages name their peer by routing id, its monitor events by file
descriptor; the message's source descriptor (``zmq.SRCFD``) joins the two.
"""

from __future__ import annotations

import zmq

from mesh.transport import close_monitor, disconnect_monitor, disconnected_fds


class LinkWatch:
    """Routing ids by connection (file descriptor); the ids whose connection closed."""

    def __init__(self) -> None:
        self.monitor: zmq.Socket | None = None
        self._sock: zmq.Socket | None = None
        self._by_fd: dict[int, bytes] = {}
        self._fd_of: dict[bytes, int] = {}

    def open(self, sock: zmq.Socket) -> zmq.Socket:
        """Start watching ``sock``'s disconnects; the monitor socket, for the caller's poller."""
        self._sock = sock
        self.monitor = disconnect_monitor(sock)
        return self.monitor

    def close(self) -> None:
        if self._sock is not None and self.monitor is not None:
            close_monitor(self._sock, self.monitor)
        self.monitor = None

    def note(self, identity: bytes, frame: zmq.Frame) -> bytes | None:
        """``identity`` spoke over ``frame``'s connection. Returns the id that connection
        belonged to before, if another: its descriptor was closed and reused, so that peer is
        gone even if its disconnect has not been read yet."""
        if self.monitor is None:
            return None
        fd = frame.get(zmq.SRCFD)
        if not isinstance(fd, int) or fd < 0:
            return None
        before = self._by_fd.get(fd)
        self.forget(identity)
        self._by_fd[fd] = identity
        self._fd_of[identity] = fd
        return before if before not in (None, identity) else None

    def forget(self, identity: bytes) -> None:
        fd = self._fd_of.pop(identity, None)
        if fd is not None and self._by_fd.get(fd) == identity:
            del self._by_fd[fd]

    def closed(self) -> list[bytes]:
        """The ids whose connection closed since the last call (read from the monitor)."""
        gone: list[bytes] = []
        if self.monitor is None:
            return gone
        for fd in disconnected_fds(self.monitor):
            identity = self._by_fd.pop(fd, None)
            if identity is not None:
                self._fd_of.pop(identity, None)
                gone.append(identity)
        return gone

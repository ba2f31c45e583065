"""A fault-injecting TCP proxy: one listener forwarding to one upstream, its fault switchable
while it runs. Put it on one link of a mesh (a worker's link to its broker, an ingress's link to
a broker) to test what the mesh does when that link goes slow, silent or dies, on any machine
(loopback only, no privileges).

Modes (``FaultProxy.set_mode``):

- ``pass``: bytes flow both ways untouched.
- ``delay``: each chunk is forwarded ``delay_ms`` after it arrived, each way, in order (a slow
  link: a round trip costs twice the delay more).
- ``drop``: a silent partition: nothing is read or forwarded, sockets stay open, bytes wait in
  the kernels' buffers as TCP's would wait for retransmission; ``pass`` again delivers them (the
  link heals). New connections are accepted and held, not passed upstream, until it heals.
- ``blackhole``: bytes are read and thrown away, sockets stay open: the peers never learn. New
  connections are held as in ``drop``.
- ``reset``: every open connection is closed with a RST at once, and every new one as it comes
  (a peer whose process died on a reachable host: its kernel answers, the sockets see it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["pass", "delay", "drop", "blackhole", "reset"]
MODES: tuple[Mode, ...] = ("pass", "delay", "drop", "blackhole", "reset")
CHUNK = 1 << 16
HOLD_POLL_S = 0.05  # how often a connection accepted during a partition looks for the heal


@dataclass(eq=False)  # hashed by identity: links live in a set
class _Link:
    """One accepted connection and its upstream connection."""

    down: asyncio.StreamWriter  # to the client that connected to the proxy
    up: asyncio.StreamWriter  # to the upstream server
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a RST (SO_LINGER on, zero seconds) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """``listen`` → ``upstream``; ``start()`` in a running loop, or ``run_in_thread()``."""

    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.upstream = upstream
        self.listen = listen
        self.mode: Mode = "pass"
        self.delay_ms = 0.0
        self.accepted = 0  # connections accepted, over the proxy's life
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def endpoint(self) -> str:
        """The proxy's address as a ZeroMQ endpoint (``tcp://HOST:PORT``)."""
        return f"tcp://{self.listen[0]}:{self.port}"

    # ---- control ------------------------------------------------------------------------------

    def set_mode(self, mode: Mode, delay_ms: float = 0.0) -> None:
        """Switch the fault; thread-safe (from a test thread while the proxy runs in its own)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._apply, mode, delay_ms)
        else:
            self._apply(mode, delay_ms)

    def _apply(self, mode: Mode, delay_ms: float) -> None:
        self.mode, self.delay_ms = mode, delay_ms
        if mode == "drop":
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode == "reset":
            for link in list(self._links):
                self._close(link, rst=True)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._accept, *self.listen)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            self._close(link, rst=False)
        if self._server is not None:
            await self._server.wait_closed()

    def run_in_thread(self) -> FaultProxy:
        """Start on a loop of its own in a daemon thread; returns once it listens."""
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=main, name="faultproxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop_thread(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.run_in_thread()

    def __exit__(self, *_: object) -> None:
        self.stop_thread()

    # ---- forwarding ---------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        # Partitioned: the upstream does not learn of the connection until the link heals
        # (the client's bytes wait in the kernel meanwhile, as its SYN's retries would).
        while self.mode in ("drop", "blackhole"):
            await asyncio.sleep(HOLD_POLL_S)
        if self.mode == "reset":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)  # as the upstream's own kernel would answer: refused
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
            link.tasks.append(asyncio.create_task(self._read(link, src, chunks)))
            link.tasks.append(asyncio.create_task(self._send(link, chunks, dst)))

    async def _read(
        self, link: _Link, src: asyncio.StreamReader, chunks: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        """Read ``src`` under the current fault, stamping each chunk with when it is due."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._flowing.wait()  # drop: stop reading; the bytes wait in the kernel
                data = await src.read(CHUNK)
                if self.mode == "blackhole" and data:
                    continue
                delay_s = self.delay_ms / 1000 if self.mode == "delay" else 0.0
                chunks.put_nowait((loop.time() + delay_s, data))  # b"": the end, once due
                if not data:
                    return
        except OSError:
            self._close(link, rst=self.mode == "reset")

    async def _send(
        self, link: _Link, chunks: asyncio.Queue[tuple[float, bytes]], dst: asyncio.StreamWriter
    ) -> None:
        """Write each chunk once it is due (a delay shifts every chunk, it does not space them)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await chunks.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                await self._flowing.wait()  # read just before a drop began: held, not sent
                if not data:
                    break
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        self._close(link, rst=self.mode == "reset")

    def _close(self, link: _Link, rst: bool) -> None:
        if link not in self._links:
            return
        self._links.discard(link)
        for writer in (link.down, link.up):
            if rst:
                _reset(writer)
            else:
                writer.close()
        for task in link.tasks:
            if task is not asyncio.current_task():
                task.cancel()


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.faultproxy --upstream HOST:PORT [--listen HOST:PORT]``: prints the
    port it listens on, then takes one command a line on stdin: ``pass``, ``delay MS``,
    ``drop``, ``blackhole``, ``reset``; ends at end of input."""
    import argparse
    import sys

    def address(text: str) -> tuple[str, int]:
        host, _, port = text.rpartition(":")
        return host or "127.0.0.1", int(port)

    parser = argparse.ArgumentParser(prog="python -m bench.faultproxy", description=main.__doc__)
    parser.add_argument("--upstream", type=address, required=True)
    parser.add_argument("--listen", type=address, default=("127.0.0.1", 0))
    args = parser.parse_args(argv)
    with FaultProxy(args.upstream, args.listen) as proxy:
        print(f"listening on {proxy.listen[0]}:{proxy.port}", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                proxy.set_mode(words[0], float(words[1]) if len(words) > 1 else 0.0)  # type: ignore[arg-type]
            except ValueError as exc:
                print(exc, file=sys.stderr, flush=True)
                continue
            print(f"mode {' '.join(words)}", flush=True)


if __name__ == "__main__":
    main()

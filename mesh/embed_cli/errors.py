"""The command's failures, each with the exit status a script sees."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """``mesh-embed``'s exit statuses (documented in ``--help`` and docs/mesh-embed.md)."""

    DONE = 0
    USAGE = 1  # a wrong option, an unreadable or malformed input, an output in the way
    REFUSED = 2  # the server refused a request (a 4xx other than 408, 409 and 429)
    UNAVAILABLE = 3  # the server stayed unavailable (429, 5xx, no connection) after retries
    PARTIAL = 4  # --batch: the output is written, but some rows failed (OUT.errors.jsonl)
    INTERRUPTED = 130  # SIGINT or SIGTERM: the progress made is saved for --resume


class EmbedError(Exception):
    """A failure that ends the command with ``code`` and a one-line ``message``."""

    code = ExitCode.USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(EmbedError):
    """The input, the output or an option is wrong; nothing the server said."""


class ServerRefused(EmbedError):
    """A 4xx that retrying cannot fix; the message is the server's."""

    code = ExitCode.REFUSED


class ServerUnavailable(EmbedError):
    """Retries ran out on 429, 5xx or connection errors."""

    code = ExitCode.UNAVAILABLE

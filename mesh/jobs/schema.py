"""The store's tables, in DDL both databases accept (``{serial}`` is the dialect's counter key).

``seq`` orders lists newest first and pages them (``after`` an id = below that id's seq);
``chunks`` holds a running batch's leases, ``results`` one row per finished input line (both
are dropped when the batch ends: its output file holds what they pointed at).
"""

from __future__ import annotations

import re

TABLES = (
    """CREATE TABLE IF NOT EXISTS files (
        seq {serial},
        id TEXT NOT NULL UNIQUE,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        status TEXT NOT NULL,
        expires_at BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS batches (
        seq {serial},
        id TEXT NOT NULL UNIQUE,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        in_progress_at BIGINT,
        finalizing_at BIGINT,
        completed_at BIGINT,
        failed_at BIGINT,
        cancelling_at BIGINT,
        cancelled_at BIGINT,
        expired_at BIGINT,
        output_file_id TEXT,
        error_file_id TEXT,
        total BIGINT NOT NULL DEFAULT 0,
        completed BIGINT NOT NULL DEFAULT 0,
        failed BIGINT NOT NULL DEFAULT 0,
        tokens_done BIGINT NOT NULL DEFAULT 0,
        tokens_total BIGINT NOT NULL DEFAULT 0,
        metadata TEXT,
        errors TEXT,
        owner TEXT,
        lease_expires_at DOUBLE PRECISION
    )""",
    "CREATE INDEX IF NOT EXISTS batches_status ON batches (status)",
    """CREATE TABLE IF NOT EXISTS chunks (
        batch_id TEXT NOT NULL,
        chunk_no INTEGER NOT NULL,
        first_line BIGINT NOT NULL,
        end_line BIGINT NOT NULL,
        byte_start BIGINT NOT NULL,
        byte_end BIGINT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        owner TEXT,
        attempt INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        lease_expires_at DOUBLE PRECISION,
        PRIMARY KEY (batch_id, chunk_no)
    )""",
    "CREATE INDEX IF NOT EXISTS chunks_state ON chunks (state, batch_id)",
    """CREATE TABLE IF NOT EXISTS results (
        batch_id TEXT NOT NULL,
        line_no BIGINT NOT NULL,
        custom_id TEXT NOT NULL,
        ok INTEGER NOT NULL,
        part TEXT NOT NULL,
        part_offset BIGINT NOT NULL,
        part_length BIGINT NOT NULL,
        PRIMARY KEY (batch_id, line_no)
    )""",
)


def objects() -> list[str]:
    """The name of every table and index ``TABLES`` creates, in order."""
    return [re.search(r"IF NOT EXISTS (\w+)", t).group(1) for t in TABLES]  # type: ignore[union-attr]


def ddl(serial: str) -> list[str]:
    return [t.replace("{serial}", serial) for t in TABLES]

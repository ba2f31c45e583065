"""A minimal batch runner as its own process, for the job store's lease tests.

It claims chunks until no batch is unfinished, writes one output line per input line (naming
itself as the owner), renews its lease while it works, and logs each claim as a JSON line to
``--claims-log``. ``--hang-on-claim N`` makes it stop dead on its N-th claim (after writing
``--hang-marker``), holding the lease until its parent kills it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from mesh.jobs import LeaseLost, LineResult, open_store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--state-url", default="")
    ap.add_argument("--owner", required=True)
    ap.add_argument("--lease-s", type=float, default=30.0)
    ap.add_argument("--line-delay", type=float, default=0.0)
    ap.add_argument("--claims-log", required=True)
    ap.add_argument("--hang-on-claim", type=int, default=0)
    ap.add_argument("--hang-marker", default="")
    args = ap.parse_args()
    store = open_store(args.state_dir, args.state_url or None)
    claims = 0
    while True:
        lease = store.claim_chunk(args.owner, lease_s=args.lease_s)
        if lease is None:
            if not store.unfinished_batches():
                break
            time.sleep(0.05)
            continue
        claims += 1
        record = {"batch": lease.batch_id, "chunk": lease.chunk_no, "attempt": lease.attempt}
        _append(args.claims_log, {**record, "owner": args.owner})
        if claims == args.hang_on_claim:
            _append(args.hang_marker, record)
            time.sleep(3600)
        results = []
        renewed_at = time.monotonic()
        for line_no, raw in enumerate(store.read_chunk(lease), start=lease.span.first_line):
            time.sleep(args.line_delay)
            if time.monotonic() - renewed_at > args.lease_s / 3:
                lease = store.renew(lease, lease_s=args.lease_s)
                renewed_at = time.monotonic()
            custom_id = json.loads(raw)["custom_id"]
            body = {"custom_id": custom_id, "owner": args.owner, "line": line_no}
            results.append(LineResult(line_no, custom_id, output=json.dumps(body).encode()))
        try:
            store.complete_chunk(lease, results)
        except LeaseLost:
            continue
    store.close()


def _append(path: str, record: dict[str, object]) -> None:
    # One write of one line with O_APPEND: lines of concurrent processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()

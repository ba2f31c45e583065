#!/bin/bash
cd /work/main
for r in 1 2; do for s in nice idle; do
  echo "== $s $r $(date +%T)"
  EMBEDMESH_BULK_SCHED=$s HF_HUB_OFFLINE=1 .venv/bin/mesh-bench --no-baseline --spawn '' --mode mixed --concurrency 4 --bulk-texts-per-request 64 \
    --live-rate 5 --duration 60 --warmup 5 --encoding-format base64 --json /work/notes/cpu-sched/$s-$r/mixed.json > /work/notes/cpu-sched/$s-$r.log 2>&1
  grep -E "^mixed in|bulk alone:" /work/notes/cpu-sched/$s-$r.log | head -3
done; done

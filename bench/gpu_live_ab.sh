#!/usr/bin/env bash
# Issue 8's MiniLM live query under bulk on the H200 (after docs/gpu.md's setup prefix), in one
# call: `mesh-bench --mode mixed` alternating
#   nice       the defaults (the ingress's bulk tokenizer processes at nice 10);
#   idle       EMBEDMESH_BULK_SCHED=idle (those processes under SCHED_IDLE);
#   idle-crit  idle, and every thread of the broker and the worker reniced to -10 by a watcher
#              here (a probe of whether the live hops' tail is CPU wait in those two processes;
#              nothing in the mesh does this);
# (or the ';'-separated NAME=ENV| of $LIVE_AB_CONFIGS), each its own bulk-alone run and bulk + 10 live queries a second, $MIXED_SECONDS windows.
#
#   bash bench/gpu_live_ab.sh OUT [ROUNDS]
set -uo pipefail
out=${1:?usage: gpu_live_ab.sh OUT [ROUNDS]}
rounds=${2:-2}
cd "$(dirname "$0")/.."
mkdir -p "$out"
# The watcher renices the threads of processes whose environment carries EMBEDMESH_PROBE_CRIT=1.
(while sleep 0.5; do
  for p in $(pgrep -f -- "--role (broker|worker)"); do
    grep -qz '^EMBEDMESH_PROBE_CRIT=1$' "/proc/$p/environ" 2>/dev/null || continue
    for t in /proc/$p/task/*; do renice -n -10 -p "${t##*/}" >/dev/null 2>>"$out/renice.err"; done
  done
done) &
watcher=$!
configs=${LIVE_AB_CONFIGS:-"nice=|;idle=EMBEDMESH_BULK_SCHED=idle|;idle-crit=EMBEDMESH_BULK_SCHED=idle EMBEDMESH_PROBE_CRIT=1|"}
for round in $(seq 1 "$rounds"); do
  SKIP_JIT=${SKIP_JIT:-} MIXED_SECONDS=${MIXED_SECONDS:-10} MIXED_TIMEOUT=${MIXED_TIMEOUT:-150} MIXED_CONFIGS="$configs" \
    bash bench/gpu_proof.sh "$out/r$round" mixed
  SKIP_JIT=1
done
kill "$watcher" 2>/dev/null
sort -u "$out/renice.err" 2>/dev/null | head -n 3
true

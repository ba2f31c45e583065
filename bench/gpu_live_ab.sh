#!/usr/bin/env bash
# Issue 8's MiniLM live query under bulk on the H200 (after docs/gpu.md's setup prefix), in one
# call: `mesh-bench --mode mixed` alternating
#   nice       EMBEDMESH_BULK_SCHED=nice (the ingress's bulk tokenizer processes at nice 10 alone;
#              the default before the eighth session);
#   idle       EMBEDMESH_BULK_SCHED=idle (those processes also under SCHED_IDLE; the default now);
#   idle-crit  idle, and every thread of the broker and the worker reniced to -10 by a watcher
#              here (a probe of whether the live hops' tail is CPU wait in those two processes;
#              nothing in the mesh does this)
# (or the ';'-separated NAME=ENV| of $LIVE_AB_CONFIGS), each its own bulk-alone run and bulk +
# 10 live queries a second, $MIXED_SECONDS windows (default 15) after $MIXED_WARMUP (default 8;
# 4 s left lazy graph captures inside the bulk-alone window).
#
#   bash bench/gpu_live_ab.sh OUT [ROUNDS]
set -uo pipefail
out=${1:?usage: gpu_live_ab.sh OUT [ROUNDS]}
rounds=${2:-2}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
# The watcher renices, once each, the threads of processes whose environment carries
# EMBEDMESH_PROBE_CRIT=1 (one renice call per process and pass, so that it does not take the
# CPU it measures), and logs what each thread's nice reads afterwards.
(declare -A seen
while sleep 0.5; do
  for p in $(pgrep -f -- "--role (broker|worker)"); do
    grep -qz '^EMBEDMESH_PROBE_CRIT=1$' "/proc/$p/environ" 2>/dev/null || continue
    fresh=()
    for t in /proc/"$p"/task/*; do
      t=${t##*/}; [ -n "${seen[$t]:-}" ] || { fresh+=("$t"); seen[$t]=1; }
    done
    [ ${#fresh[@]} -gt 0 ] || continue
    renice --priority -10 -p "${fresh[@]}" >/dev/null 2>>"$out/renice.err"
    for t in "${fresh[@]}"; do
      echo "$p $t nice $(awk '{print $19}' "/proc/$p/task/$t/stat" 2>/dev/null)" >>"$out/renice.log"
    done
  done
done) &
watcher=$!
trap 'kill "$watcher" 2>/dev/null' EXIT
configs=${LIVE_AB_CONFIGS:-"nice=EMBEDMESH_BULK_SCHED=nice|;idle=EMBEDMESH_BULK_SCHED=idle|;idle-crit=EMBEDMESH_BULK_SCHED=idle EMBEDMESH_PROBE_CRIT=1|"}
for round in $(seq 1 "$rounds"); do
  SKIP_JIT=${SKIP_JIT:-} MIXED_SECONDS=${MIXED_SECONDS:-15} MIXED_WARMUP=${MIXED_WARMUP:-8} \
    MIXED_TIMEOUT=${MIXED_TIMEOUT:-150} MIXED_CONFIGS="$configs" \
    bash bench/gpu_proof.sh "$out/r$round" mixed
  SKIP_JIT=1
done
sort -u "$out/renice.err" 2>/dev/null | head -n 3
true

#!/usr/bin/env bash
# The idle query (mesh-bench --mode hops, MiniLM) of two checkouts on the H200, alternated in one
# call, so that a change's effect is not confused with the draw of the machine (a fresh one
# per call; the same code's idle HTTP p50 moved 2.8-3.5 ms between calls):
#
#   git archive BASE -- . ':!docs' | gzip > .carry/base.tgz      # here, then carry it
#   bash bench/gpu_hops_ab.sh .carry/base.tgz OUT [ROUNDS]        # there, after the prefix
#
# Runs `bench/gpu_proof.sh OUT/<base|head>-rN hops` from each tree in turn (the base tree
# extracted to /tmp/hops-base, sharing this tree's .carry), ROUNDS times (default 2).
set -uo pipefail
archive=${1:?usage: gpu_hops_ab.sh BASE.tgz OUT [ROUNDS]}
out=${2:?usage: gpu_hops_ab.sh BASE.tgz OUT [ROUNDS]}
rounds=${3:-2}
head=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" && out=$(cd "$out" && pwd)
base=/tmp/hops-base
rm -rf "$base" && mkdir -p "$base" && tar -xzf "$archive" -C "$base" && ln -sfn "$head/.carry" "$base/.carry"
rest=${PYTHONPATH#"$head"}  # the setup prefix's PYTHONPATH is this tree, then the wheels
for round in $(seq 1 "$rounds"); do
  for side in base head; do
    tree=$head; [ "$side" = base ] && tree=$base
    echo "== $side, round $round"
    (cd "$tree" && PYTHONPATH="$tree$rest" HOPS_PROCS=default SKIP_JIT=1 \
      bash bench/gpu_proof.sh "$out/$side-r$round" hops)
  done
done

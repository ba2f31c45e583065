#!/usr/bin/env bash
# Issue 8's idle query on the H200 (after docs/gpu.md's setup prefix), in one call:
#   1. MiniLM hops (300 idle 12-word queries: engine, MeshClient, HTTP per hop), four runs
#      (the fifth session alternated them with a broker spin, EMBEDMESH_BROKER_SPIN_US, an
#      experiment that made no difference and was never committed: docs/gpu.md);
#   2. MiniLM mixed (bulk + 10 live queries a second, $MIXED_SECONDS windows), bulk tokenizer
#      processes at nice 10 vs SCHED_IDLE (EMBEDMESH_BULK_SCHED=idle);
#   3. BERT-base and Qwen3-0.6B shapes' hops with the defaults.
#
#   bash bench/gpu_idle_ab.sh OUT
set -uo pipefail
out=${1:?usage: gpu_idle_ab.sh OUT}
cd "$(dirname "$0")/.."
hops() {  # NAME MODEL_DIR MODEL_NAME
  python3 -m bench.cli --no-baseline --engine-budgets '' \
    --spawn "--device cuda --model $2 --warmup-buckets 16,32,64,128,256" \
    --model-name "$3" --encoding-format base64 --mode hops --latency-requests 300 \
    --json "$out/hops-$1/hops.json" >"$out/hops-$1.log" 2>&1
  echo "== $1"; grep -A3 "^hops in" "$out/hops-$1.log" | head -n 4
}
mkdir -p "$out"
# FlashInfer's JIT and the two shapes first: compiling beside a measurement would skew it.
bash bench/gpu_proof.sh "$out" models >/dev/null 2>&1
for round in 1 2 3 4; do
  hops "minilm-$round" .carry/minilm all-MiniLM-L6-v2
done
SKIP_JIT=1 MIXED_SECONDS=${MIXED_SECONDS:-20} MIXED_TIMEOUT=150 \
  MIXED_CONFIGS="nice=EMBEDMESH_BULK_SCHED=nice|;sched-idle=EMBEDMESH_BULK_SCHED=idle|" bash bench/gpu_proof.sh "$out" mixed
hops bert-base /tmp/models/bert-base bert-base
hops qwen3 /tmp/models/qwen3-0.6b qwen3-0.6b

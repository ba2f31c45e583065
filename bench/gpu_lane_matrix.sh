#!/usr/bin/env bash
# Diagnostic, on the GPU machine (after docs/gpu.md's setup prefix): which change keeps the live
# lane from stalling the GPU beside FlashInfer bulk (docs/gpu.md, "The live lane stalls the GPU").
# Issue 8's mixed load (bulk closed loop + 10 live queries a second) with `--live-lane on`, one
# suspect removed per configuration; the control (every suspect in place) runs last so that a
# stalled GPU cannot spoil the others.
#
#   bash bench/gpu_lane_matrix.sh OUT
#
# SECONDS_EACH: mixed window (default 10); SKIP_JIT=1 when FlashInfer's JIT is warm.
set -uo pipefail
out=${1:?usage: gpu_lane_matrix.sh OUT}
cd "$(dirname "$0")/.."
shared=EMBEDMESH_SHARED_CAPTURE_STREAM=1
all=$(python3 -c "from mesh.worker.engine.gpu import bucket_sizes; print(','.join(map(str, bucket_sizes(16384))))")
run() {  # MODEL_NAME STAGES CONFIGS
  MIXED_MODEL=/tmp/models/$1 MIXED_MODEL_NAME=$1 MIXED_SECONDS=${SECONDS_EACH:-10} \
    MIXED_TIMEOUT=120 MIXED_CONFIGS=$3 bash bench/gpu_proof.sh "$out/$1" "$2"
}
# own: the runner's own capture stream (the default now); pdl0 / nows / warmall: the old shared
# stream with FlashInfer's PDL off / no cuBLAS workspace / every bucket captured at start.
SKIP_JIT=${SKIP_JIT:-} run bert-base models,mixed \
  "own=|--live-lane on;pdl0=$shared EMBEDMESH_FLASHINFER_PDL=0|--live-lane on;nows=$shared CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0|--live-lane on;warmall=$shared|--live-lane on --warmup-buckets $all"
SKIP_JIT=1 run qwen3-0.6b mixed "own=|--live-lane on"
SKIP_JIT=1 run bert-base mixed "shared=$shared|--live-lane on"
cp /tmp/embedmesh-bench-*.log "$out/" 2>/dev/null
true

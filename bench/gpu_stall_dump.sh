#!/usr/bin/env bash
# Diagnostic, on the GPU machine (after docs/gpu.md's setup prefix): serve a model with the
# defaults, put issue 8's mixed load on it (bulk closed loop + 10 live queries a second), then
# dump every thread's stack of the worker and the broker (SIGUSR1: faulthandler) and a per-
# thread CPU snapshot, twice, while the load runs. For a mesh that stalls under that load.
#
#   bash bench/gpu_stall_dump.sh OUT MODEL_DIR MODEL_NAME [DUMP_AFTER_S]
#
# MESH_ARGS: more mesh-launch flags (e.g. "--live-lane on"); the environment passes through
# (e.g. EMBEDMESH_FLASHINFER_PDL=0). DEVICE: cuda (default) or cpu.
set -uo pipefail
out=${1:?usage: gpu_stall_dump.sh OUT MODEL_DIR MODEL_NAME [DUMP_AFTER_S]}
model=${2:?}; name=${3:?}; after=${4:-25}
mkdir -p "$out"
cd "$(dirname "$0")/.."
port=18123
mesh-launch() { python3 -m launch.cli "$@"; }
mesh-launch --role all --device "${DEVICE:-cuda}" --model "$model" --warmup-buckets 16,32,64,128,256 \
  --http-port $port --auto-truncate ${MESH_ARGS:-} >"$out/mesh.log" 2>&1 &
mesh=$!
for _ in $(seq 180); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done
python3 -m bench.cli --no-baseline --engine-budgets '' --url "http://127.0.0.1:$port/v1" \
  --model-name "$name" --encoding-format base64 --mode mixed --concurrency 32 \
  --bulk-texts-per-request 64 --live-rate 10 --procs 4 --duration 6 --warmup 2 \
  --json "$out/mixed.json" >"$out/bench.log" 2>&1 &
bench=$!
sleep "$after"
for round in 1 2; do
  for role in worker broker; do
    for pid in $(pgrep -f -- "--role $role"); do
      top -H -b -n 1 -p "$pid" | head -n 20 >"$out/top-$role-$pid-$round.txt"
      kill -USR1 "$pid"
    done
  done
  nvidia-smi >"$out/nvidia-smi-$round.txt" 2>&1
  sleep 4
done
kill "$bench" 2>/dev/null; kill "$mesh" 2>/dev/null
sleep 5; kill -9 "$mesh" 2>/dev/null
tail -n 5 "$out/bench.log"

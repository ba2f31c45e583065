#!/usr/bin/env bash
# The mesh through HTTP on the H200, as users reach it (issue #8), with the engine alone measured
# in the same call as the baseline. Run on the GPU machine after the setup prefix of
# docs/gpu.md's "Commands" (the wheels and FlashInfer in .whl and .carry, .carry/minilm):
#
#   bash bench/gpu_http.sh OUT [MODELS] [SECONDS]
#
# MODELS: a comma list of minilm, bert-base, qwen3-0.6b (default all three); SECONDS: each
# measured window (default 15). Per model: mesh-bench spawns `mesh-launch --role all` on the GPU
# (ingress processes from the default: half the cores), then `hops` (one 12-word query, idle,
# engine alone vs MeshClient vs HTTP, per-hop p50) and `mixed` (bulk alone: 32 clients x 64
# texts, base64; then the same bulk plus 10 live queries a second), load from 4 processes.
set -uo pipefail
out=${1:?usage: gpu_http.sh OUT [MODELS] [SECONDS]}
models=${2:-minilm,bert-base,qwen3-0.6b}
secs=${3:-15}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

# Model directories the same way the engine benchmark makes them (random weights in the real
# shapes for BERT-base and Qwen3-0.6B; the fp16 MiniLM copy in .carry/minilm).
python3 - "$out/models" "$models" <<'EOF'
import sys
from pathlib import Path
sys.argv = sys.argv[:3]
from bench.gpu_engine import prepare_dirs
work = Path(sys.argv[1]); work.mkdir(parents=True, exist_ok=True)
for name, path in prepare_dirs(work, sys.argv[2].split(",")).items():
    (work / f"{name}.path").write_text(str(path))
EOF

# FlashInfer's fa2 JIT for both head dims at once (30-40 s each), before anything times it.
(for d in 64 128; do python3 tests/gpu/jit_warm.py $d >"$out/jit-$d.log" 2>&1 & done; wait)

# The baseline of the same call: the engine alone on the engine benchmark's workload.
python3 bench/gpu_engine.py --out "$out/engine" --no-mesh --no-st --models "$models" \
  --texts "${ENGINE_TEXTS:-10000}" >"$out/engine.log" 2>&1
tail -n 6 "$out/engine.log"

for name in ${models//,/ }; do
  dir=$(cat "$out/models/$name.path")
  echo "== $name ($dir)"
  python3 -m bench.cli --no-baseline --engine-budgets '' \
    --spawn "--device cuda --model $dir --warmup-buckets 16,32,64,128,256" \
    --model-name "$name" --encoding-format base64 \
    --mode hops --latency-requests 300 \
    --mode mixed --concurrency 32 --bulk-texts-per-request 64 --live-rate 10 \
    --procs 4 --duration "$secs" --warmup 5 \
    --json "$out/http-$name.json" 2>&1 | tee "$out/http-$name.log" | tail -n 40
done

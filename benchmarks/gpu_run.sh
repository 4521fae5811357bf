#!/usr/bin/env bash
# Every GPU benchmark in one call on a lent GPU (about 6 minutes on one H100 or H200):
#   bash benchmarks/gpu_run.sh OUT_DIR
# Each benchmark runs its models in fresh processes under its own deadline and keeps what
# finished; the results land in OUT_DIR (commit them under benchmarks/results/, naming the card).
set -u
out=${1:?usage: gpu_run.sh OUT_DIR}
mkdir -p "$out"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L || true
python3 benchmarks/exec_overhead.py --device cuda --out "$out/exec_overhead_cuda"  # ~15 s: host work per op
python3 benchmarks/gpu_budget.py --out "$out" --deadline-s 150
python3 benchmarks/gpu_speed.py --out "$out" --deadline-s 140
python3 benchmarks/pool_training.py --out "$out" --deadline 80

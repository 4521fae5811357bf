#!/usr/bin/env bash
# Every GPU benchmark in one call on a lent GPU (about 10 minutes on one H100 or H200):
#   bash benchmarks/gpu_run.sh OUT_DIR [BENCHMARK...]
# BENCHMARK: exec_overhead gpu_budget gpu_speed pool_training gpu_graph (default: all, in that order);
# name one or two where a call may take less (gpu_graph alone: about 4 minutes).
# Each benchmark runs its models in fresh processes under its own deadline and keeps what
# finished; the results land in OUT_DIR (commit them under benchmarks/results/, naming the card).
set -u
out=${1:?usage: gpu_run.sh OUT_DIR [BENCHMARK...]}
shift
want=" ${*:-exec_overhead gpu_budget gpu_speed pool_training gpu_graph} "
wanted() { [[ $want == *" $1 "* ]]; }
mkdir -p "$out"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L || true
wanted exec_overhead && python3 benchmarks/exec_overhead.py --device cuda --out "$out/exec_overhead_cuda"  # ~15 s: host work per op
wanted gpu_budget && python3 benchmarks/gpu_budget.py --out "$out" --deadline-s 150
wanted gpu_speed && python3 benchmarks/gpu_speed.py --out "$out" --deadline-s 140
wanted pool_training && python3 benchmarks/pool_training.py --out "$out" --deadline 80
wanted gpu_graph && python3 benchmarks/gpu_graph.py --out "$out" --deadline-s 220  # issue 35: the step as a CUDA graph
true

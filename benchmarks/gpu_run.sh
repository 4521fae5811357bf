#!/usr/bin/env bash
# GPU benchmarks in one call on a lent GPU:
#   bash benchmarks/gpu_run.sh [--dry-run] OUT_DIR [BENCHMARK...]
# Default: issue 36's run, at most 8 minutes on one H100 or H200 with start-up: gpu_budget (every
# paper's planner under a memory cap, most important rows first, deadline 360 s) then gpu_pytest
# (`pytest -m gpu`, 90 s at most). Also by name: exec_overhead gpu_speed pool_training gpu_graph
# (all four: about 8 more minutes; gpu_graph alone about 4). `session`: gpu_pytest, exec_overhead,
# gpu_speed, gpu_graph and gpu_budget in one call of at most 9.5 minutes under shorter deadlines
# (each benchmark's most important rows first): what one session's device time allows.
# --dry-run: the same code paths on the CPU with small models (no GPU; 2-3 minutes on two busy cores).
# Each benchmark runs its models in fresh processes under its own deadline and keeps what
# finished; the results land in OUT_DIR as JSON (commit them under benchmarks/results/, naming the card).
set -u
usage="usage: gpu_run.sh [--dry-run] OUT_DIR [BENCHMARK...]"
dry=()
if [[ ${1:-} == --dry-run ]]; then dry=(--dry-run); shift; fi
out=${1:-}
if [[ -z $out || $out == -* ]]; then echo "gpu_run.sh: error: $usage" >&2; exit 2; fi
shift
known=" gpu_budget gpu_pytest exec_overhead gpu_speed pool_training gpu_graph session "
for b in "$@"; do
  if [[ $known != *" $b "* ]]; then echo "gpu_run.sh: error: unknown benchmark '$b'; known:$known" >&2; exit 2; fi
  if [[ ${#dry[@]} -gt 0 && ( $b == exec_overhead || $b == session ) ]]; then
    echo "gpu_run.sh: error: $b has no dry run (exec_overhead measures the GPU's host work)" >&2; exit 2
  fi
done
want=" ${*:-gpu_budget gpu_pytest} "
wanted() { [[ $want == *" $1 "* ]]; }
mkdir -p "$out"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
[[ ${#dry[@]} -eq 0 ]] && { nvidia-smi -L || true; }
if [[ $want == *" session "* ]]; then  # correctness first, then the measured rows
  $py benchmarks/gpu_pytest.py --out "$out" --timeout-s 60
  $py benchmarks/exec_overhead.py --device cuda --out "$out/exec_overhead_cuda"
  $py benchmarks/gpu_speed.py --out "$out" --deadline-s 170
  $py benchmarks/gpu_graph.py --out "$out" --deadline-s 120
  $py benchmarks/gpu_budget.py --out "$out" --deadline-s 150
  exit 0
fi
wanted gpu_budget && $py benchmarks/gpu_budget.py --out "$out" --deadline-s 360 "${dry[@]}"
wanted gpu_pytest && $py benchmarks/gpu_pytest.py --out "$out" --timeout-s 90
wanted exec_overhead && $py benchmarks/exec_overhead.py --device cuda --out "$out/exec_overhead_cuda"  # ~15 s
wanted gpu_speed && $py benchmarks/gpu_speed.py --out "$out" --deadline-s 140 "${dry[@]}"
wanted pool_training && $py benchmarks/pool_training.py --out "$out" --deadline 80 "${dry[@]}"
wanted gpu_graph && $py benchmarks/gpu_graph.py --out "$out" --deadline-s 220 "${dry[@]}"  # issue 35: the step as a CUDA graph
true

#!/usr/bin/env bash
# GPU benchmarks in one call on a lent GPU:
#   bash benchmarks/gpu_run.sh [--dry-run] OUT_DIR [BENCHMARK...]
# Default: issue 51's run, at most 8 minutes on one H100 or H200 with start-up, correctness first:
# gpu_sanitizer (a small planned case under TORCH_CUDA_SANITIZER=1, eager and captured, 90 s), gpu_pytest
# (`pytest -m gpu`, 60 s), gpu_graph (the captured step on transformer-encoder@32 and hf:gpt2@8 first, 140 s),
# gpu_budget (every paper's planner under a memory cap, most important rows first, 120 s), gpu_compile
# (issue 47: plans lowered onto torch.compile under a memory cap, gpt2@8 first, 90 s). Also by name:
# exec_overhead gpu_speed pool_training, and each of the above alone (gpu_budget 360 s, gpu_pytest 90 s,
# gpu_graph 220 s, gpu_compile 240 s). `session`: gpu_pytest, gpu_sanitizer, exec_overhead, gpu_speed,
# gpu_graph, gpu_budget and gpu_compile in one call of at most 9.5 minutes under shorter deadlines.
# --dry-run: the same code paths on the CPU with small models (no GPU); gpu_sanitizer's runs its cases on
# memplan.testing.cuda_rules, the CPU stand-in that checks CUDA's rules.
# Each benchmark runs its models in fresh processes under its own deadline and keeps what
# finished; a failed row says its first error and the step it came from; the results land in OUT_DIR as
# JSON (commit them under benchmarks/results/, naming the card).
set -u
usage="usage: gpu_run.sh [--dry-run] OUT_DIR [BENCHMARK...]"
dry=()
if [[ ${1:-} == --dry-run ]]; then dry=(--dry-run); shift; fi
out=${1:-}
if [[ -z $out || $out == -* ]]; then echo "gpu_run.sh: error: $usage" >&2; exit 2; fi
shift
known=" gpu_budget gpu_pytest exec_overhead gpu_speed pool_training gpu_graph gpu_sanitizer gpu_compile session "
for b in "$@"; do
  if [[ $known != *" $b "* ]]; then echo "gpu_run.sh: error: unknown benchmark '$b'; known:$known" >&2; exit 2; fi
  if [[ ${#dry[@]} -gt 0 && ( $b == exec_overhead || $b == session ) ]]; then
    echo "gpu_run.sh: error: $b has no dry run (exec_overhead measures the GPU's host work)" >&2; exit 2
  fi
done
want=" ${*:-gpu_sanitizer gpu_pytest gpu_graph gpu_budget gpu_compile} "
alone=$([[ $# -gt 0 ]] && echo 1 || echo 0)  # benchmarks named get their own, longer deadlines
wanted() { [[ $want == *" $1 "* ]]; }
mkdir -p "$out"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
[[ ${#dry[@]} -eq 0 ]] && { nvidia-smi -L || true; }
if [[ $want == *" session "* ]]; then  # correctness first, then the measured rows
  $py benchmarks/gpu_pytest.py --out "$out" --timeout-s 60
  $py benchmarks/gpu_sanitizer.py --out "$out" --deadline-s 70
  $py benchmarks/exec_overhead.py --device cuda --out "$out/exec_overhead_cuda"
  $py benchmarks/gpu_speed.py --out "$out" --deadline-s 130
  $py benchmarks/gpu_graph.py --out "$out" --deadline-s 110
  $py benchmarks/gpu_budget.py --out "$out" --deadline-s 100
  $py benchmarks/gpu_compile.py --out "$out" --deadline-s 70
  exit 0
fi
deadline() { [[ $alone == 1 ]] && echo "$2" || echo "$1"; }  # in the default run, or named
wanted gpu_sanitizer && $py benchmarks/gpu_sanitizer.py --out "$out" --deadline-s 90 "${dry[@]}"  # issue 51
wanted gpu_pytest && $py benchmarks/gpu_pytest.py --out "$out" --timeout-s "$(deadline 60 90)"
wanted gpu_graph && $py benchmarks/gpu_graph.py --out "$out" --deadline-s "$(deadline 140 220)" "${dry[@]}"  # issue 35
wanted gpu_budget && $py benchmarks/gpu_budget.py --out "$out" --deadline-s "$(deadline 120 360)" "${dry[@]}"
wanted gpu_compile && $py benchmarks/gpu_compile.py --out "$out" --deadline-s "$(deadline 90 240)" "${dry[@]}"  # issue 47
wanted exec_overhead && $py benchmarks/exec_overhead.py --device cuda --out "$out/exec_overhead_cuda"  # ~15 s
wanted gpu_speed && $py benchmarks/gpu_speed.py --out "$out" --deadline-s 140 "${dry[@]}"
wanted pool_training && $py benchmarks/pool_training.py --out "$out" --deadline 80 "${dry[@]}"
true

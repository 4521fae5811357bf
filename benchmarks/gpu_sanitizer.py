"""Issue 51 on a GPU: a small planned case under PyTorch's CUDA sanitizer, run eagerly and captured.

On a GPU each case is `memplan run` in a fresh process with TORCH_CUDA_SANITIZER=1 (torch.cuda._sanitizer,
"CSAN": every kernel's reads and writes checked against the streams' synchronization; a possible data race
raises, with the stack traces of both accesses). Its row keeps the exit code, the races CSAN reported and
the first report's first lines, else the run's first error and the step it came from, and from the run's
JSON whether its steps kept the budget, trained as plain training does and were captured. `--dry-run`
runs the same cases on the CPU under memplan.testing.cuda_rules, the stand-in that checks CUDA's rules
where no GPU is (copy lanes, events, the capture, the allocator's cross-stream reuse): a broken rule is the
row's error, with its step, and the eager case trains bit-identically to plain training.

    python benchmarks/gpu_sanitizer.py --out DIR [--deadline-s 150] [--dry-run]

Writes DIR/gpu_sanitizer.jsonl and DIR/gpu_sanitizer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_cases import device_info, emit, error_of, failed_at, failure, machine, read, table_row  # noqa: E402

NAME = "gpu_sanitizer"
MODEL, BATCH, CONFIG = "transformer-encoder", 8, {"optimizer": "adam-capturable"}
DRY_MODEL, DRY_BATCH, DRY_CONFIG = "transformer-encoder", 2, {"seq_len": 8, "optimizer": "sgd"}  # CPU: no capturable Adam
# case: planner, budget, cuda_graph. autoswap:doa swaps activations, parameters within the step and optimizer
# state across it (eagerly: a parameter swapped within the step is not captured); auto's plan is captured.
CASES = {"eager": ("autoswap:doa", "70%", "off"), "captured": ("auto", "70%", "on")}
DRY_CASES = {"eager": ("autoswap:doa", "70%", "off"), "captured": ("auto", "90%", "on")}  # the small model's plans
DRY_PARAMS = {"autoswap:doa": {"min_bytes": 0}, "auto": {"time_limit_s": 1.0}}
STEPS = 5  # 3 warm-up steps, the capture, a replay
RACE = "CSAN detected a possible data race"
RESULT_KEYS = ("within_budget", "max_param_diff", "measured_peak_bytes", "budget_bytes")


def gpu_case(case: str, out: str, timeout_s: float) -> dict:
    """One case in a fresh process under the CUDA sanitizer: its row."""
    planner, budget, graph = CASES[case]
    cmd = [sys.executable, "-m", "memplan", "run", MODEL, "--batch", str(BATCH), "--config",
           *(f"{k}={v}" for k, v in CONFIG.items()), "--planner", planner, "--budget", budget, "--device", "cuda",
           "--real", "--steps", str(STEPS), "--check", "--json", "--cuda-graph", graph]  # real: CSAN reads data_ptr
    rec = {"case": case, "planner": planner, "cuda_graph": graph, "command": " ".join(cmd[1:])}
    env = {**os.environ, "TORCH_CUDA_SANITIZER": "1"}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**rec, "error": f"timed out after {timeout_s:.0f} s"}
    rec.update(exit_code=done.returncode, races=done.stderr.count(RACE))
    if rec["races"]:
        report = done.stderr[done.stderr.index(RACE):].strip().splitlines()
        rec["error"] = " / ".join(report[:6])
    elif done.returncode:
        rec["error"] = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    try:
        result = json.loads(done.stdout)
        rec.update({k: result.get(k) for k in RESULT_KEYS},
                   captured=(result.get("cuda_graph") or {}).get("captured"),
                   graph_reason=(result.get("cuda_graph") or {}).get("reason"))
    except json.JSONDecodeError:
        pass
    rec["stderr_tail"] = done.stderr[-2000:]
    return rec


def dry_case(case: str) -> dict:
    """One case on the CPU, its copy lanes and capture on the CUDA stand-in: its row."""
    import torch

    from memplan import get_workload, optimize
    from memplan.testing.cuda_rules import CudaRules
    from memplan.workflows.cuda_graph import on_cuda_runtime

    planner, budget, graph = DRY_CASES[case]
    rec = {"case": case, "planner": planner, "cuda_graph": graph, "run": "CPU, CUDA stand-in"}
    w, ref = (get_workload(DRY_MODEL, DRY_BATCH, seed=0, **DRY_CONFIG) for _ in range(2))
    batches = [w.make_inputs(DRY_BATCH, seed=1 + i) for i in range(STEPS)]
    rules, step = CudaRules(), None
    try:
        step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner=planner, budget=budget,
                        **DRY_PARAMS[planner])
        torch.manual_seed(0)
        with rules:
            on_cuda_runtime(step, rules, graph)
            for i, x in enumerate(batches):
                try:
                    step(*x)
                except BaseException as exc:
                    exc.memplan_step = i
                    raise
        stats = step.stats()
        rec.update(captured=stats["cuda_graph"]["captured"], graph_reason=stats["cuda_graph"]["reason"],
                   moved=stats["swapped_out"] + stats["recomputed"], syncs=len(rules.host_syncs))
    except Exception as exc:  # noqa: BLE001 - a broken rule is the row's finding
        return {**rec, "failed_at": failed_at(exc), "error": failure(exc)[:600]}
    finally:
        if step is not None:
            step.close()
    if graph == "off":  # replays run nothing on the stand-in: only an eager case trains
        torch.manual_seed(0)
        for x in batches:
            ref.step(*x)
        rec["max_param_diff"] = max(float((p - q).detach().abs().max()) for p, q in zip(w.model.parameters(),
                                                                                          ref.model.parameters()))
    return rec


def report(out: str) -> str:
    rows = read(out, NAME)
    lines = [f"# The planned step under the CUDA sanitizer ({machine(rows)})", "",
             "Command: `python benchmarks/gpu_sanitizer.py --out DIR` (a dry run: the CPU's CUDA stand-in, "
             "memplan.testing.cuda_rules). A row is clean when nothing was reported and the run kept its budget.", "",
             "| case | planner | cuda graph | captured | moved | races | within budget | max param diff | error |",
             "| --- | --- | --- | --- | ---: | ---: | --- | ---: | --- |"]
    for r in rows:
        if r.get("case") in CASES:
            lines.append(table_row((
                r["case"], r["planner"], r["cuda_graph"], r.get("captured", "-"), r.get("moved", "-"), r.get("races", "-"),
                r.get("within_budget", "-"), r.get("max_param_diff", "-"),
                error_of(r).replace("|", "/")[:300])))
    clean = [r for r in rows if r.get("case") in CASES and not r.get("error")]
    lines += ["", f"Clean: {len(clean)} of {len(CASES)} cases."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description="A small planned case under PyTorch's CUDA sanitizer (issue 51).")
    ap.add_argument("--out", required=True, help="folder for gpu_sanitizer.jsonl and .md")
    ap.add_argument("--deadline-s", type=float, default=150, help="all cases together")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, under the CUDA stand-in")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    end = time.time() + args.deadline_s
    emit(args.out, NAME, {"case": "env", **device_info()})
    for i, case in enumerate(CASES):
        left = (end - time.time()) / (len(CASES) - i)
        emit(args.out, NAME, dry_case(case) if args.dry_run else gpu_case(case, args.out, left))
    text = report(args.out)
    with open(os.path.join(args.out, f"{NAME}.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()

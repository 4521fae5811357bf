"""SmartPool's layout as the CUDA allocator under real training (issue 26; paper 000 §III, Table I).

Each configuration -- a model, a plan, and the allocator that serves CUDA memory: `pool` (the
plan's layout served by memplan's replay allocator), `caching` (PyTorch's default) or
`expandable` (its expandable segments) -- trains in a fresh process (the allocator is chosen
before a process's first CUDA allocation) through `memplan.workflows.run.run_workload`: two
metered steps, then timed unmetered steps, and plain training from the same seed beside it
(`max_param_diff`). The caching and expandable runs plan with the same X+smartpool planner (its
decisions: under a pool that overflowed the budget, X planned under a smaller load), and run
them without the pool; `smartpool` alone decides nothing, so they run `none`. Reserved bytes are
torch's `max_memory_reserved` for caching/expandable and the pool's own (pool block plus the
most its stream-ordered heap held) for the pool; `device_used_bytes` is the GPU's own account
(cudaMemGetInfo after the run: all the process holds, its CUDA context included).

    python benchmarks/pool_training.py [--out DIR] [--deadline SECONDS]   # on a GPU (<= 150 s on an H100)
    python benchmarks/pool_training.py --dry-run [--out DIR]                # the plumbing, on the CPU

Writes pool_training_<card>.{json,md} into benchmarks/results (or DIR) after every
configuration, so a deadline keeps what finished. `--dry-run` trains small models on the CPU
with PyTorch's CPU allocator for every configuration (it cannot be replaced there): it checks
the processes, the deadline and the tables, not the pool; its rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
GPU_CASES = (("resnet50", 64, "autoswap:doa+smartpool", "50%"), ("resnet50", 64, "capuchin+smartpool", "50%"),
             ("hf:gpt2", 8, "capuchin+smartpool", "95%"), ("hf:gpt2", 8, "autoswap:doa+smartpool", "50%"),
             ("resnet50", 64, "smartpool", None), ("hf:gpt2", 8, "smartpool", None),
             ("vgg16", 64, "capuchin+smartpool", "50%"))
# The swap plans first (the no-swap rows were measured on an H200); capuchin reaches no less than
# about 94% of gpt2@8's peak (benchmarks/results/pool_plans.md), hence 95% there.
CPU_CASES = (("transformer-encoder", 4, "smartpool", None), ("transformer-encoder", 4, "autoswap:doa+smartpool", "70%"))
ALLOCATORS = ("pool", "caching", "expandable")  # pool and caching per case first; expandable last, no-swap cases only
POOL_SEARCH_S = 2.0  # SmartPool's search per plan (the layout's quality saturates quickly on these traces)
STEPS, TIMED_STEPS = 2, 4
DEADLINE_S = {"gpu": 150.0, "cpu": 1800.0}  # all configurations (a shared 2-core host is slow)
CHILD_LIMIT_S = {"gpu": 60.0, "cpu": 400.0}  # one configuration at most
MIB = 2**20


def plan_for(planner: str, allocator: str) -> tuple[str, dict]:
    """The planner a run uses and its parameters (`none` for `smartpool` without the pool)."""
    if planner == "smartpool":
        return ("smartpool", {"time_limit_s": POOL_SEARCH_S}) if allocator == "pool" else ("none", {})
    return planner, {"pool_time_limit_s": POOL_SEARCH_S}


def run_child(spec: dict) -> dict:
    """One configuration, in this (fresh) process: JSON-ready summary."""
    import torch

    from memplan import run_workload

    cuda = spec["device"] == "cuda"
    if not cuda and spec["allocator"] == "pool":
        return cpu_stream_replay(spec)
    planner, params = plan_for(spec["planner"], spec["allocator"])
    started = time.perf_counter()
    out = run_workload(spec["model"], spec["batch"], planner=planner, budget=_budget(spec), steps=STEPS,
                       timed_steps=TIMED_STEPS, device=spec["device"], check=spec["allocator"] == "pool",
                       planner_params=params, allocator=spec["allocator"] if cuda else "caching",
                       cuda_graph="off")  # the pool under the eager executor (gpu_graph.py captures it)
    used = _device_used() if cuda else None
    row = {**spec, "planner_run": planner, "wall_s": time.perf_counter() - started,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu", "device_used_bytes": used}
    row.update(_summary(out))
    return row


def cpu_stream_replay(spec: dict) -> dict:
    """Dry run of a pool configuration: the allocation requests of one real planned step on the CPU
    (torch.profiler, each with the runner's op) replayed through the host pool (memplan.testing.requests)."""
    from memplan import optimize
    from memplan.pool.replay_allocator import ReplayAllocator
    from memplan.pool.requests import step_requests
    from memplan.testing.requests import record_cpu_requests, replay_requests
    from memplan import get_workload

    started = time.perf_counter()
    planner, params = plan_for(spec["planner"], "pool")
    w = get_workload(spec["model"], spec["batch"])
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner=planner, budget=_budget(spec),
                    measure=False, **params)
    plan = step_requests(step.trace, step.program, step.plan.pool)
    step(*w.make_inputs(spec["batch"], seed=1))
    requests = record_cpu_requests(step, w.make_inputs(spec["batch"], seed=2))
    step.close()
    stats = replay_requests(ReplayAllocator("host"), plan, requests)
    pool = {"pool_bytes": plan.pool_bytes, "slots": len(plan.sizes), "peak_reserved_bytes": None,
            "peak_heap_live_bytes": stats["peak_heap_live_bytes"], "allocator_s": None,
            **{k: stats[k] for k in ("requests", "served", "served_bytes", "small", "fallbacks", "unplanned",
                                     "unplanned_bytes", "conflicts", "other_stream", "missed_slots")}}
    return {**spec, "planner_run": planner, "allocator_run": "host replay of a CPU step's requests",
            "wall_s": time.perf_counter() - started, "device_name": "cpu", "pool": pool}


def _budget(spec: dict):
    """The case's budget as the library takes it: a spec is JSON, where null is no limit (UNLIMITED)."""
    from memplan import UNLIMITED

    return UNLIMITED if spec["budget"] is None else spec["budget"]


def _device_used() -> int:
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def _summary(out: dict) -> dict:
    steps = out["steps"]
    reserved = [s.get("measured_peak_reserved_bytes") for s in steps]
    pool = out.get("pool")
    row = {"allocator_run": out.get("allocator"), "budget_bytes": out["budget_bytes"],
           "simulated_peak_bytes": out["simulated_peak_bytes"], "measured_peak_bytes": out["measured_peak_bytes"],
           "peak_reserved_bytes": max(reserved) if all(r is not None for r in reserved) else None,
           "measured_step_s": out["measured_step_s"], "max_param_diff": out.get("max_param_diff"),
           "diverged_steps": out["executor"]["diverged_steps"]}
    if pool:
        last = pool["steps"][-1]
        row["pool"] = {"pool_bytes": pool["pool_bytes"], "slots": pool["slots"],
                       "first_step_mismatches": pool["first_step"]["mismatches"],
                       "first_step_log": pool["first_step"]["log"][:16],
                       **{k: last[k] for k in ("requests", "served", "served_bytes", "small", "fallbacks", "unplanned",
                                               "unplanned_bytes", "conflicts", "other_stream", "missed_slots",
                                               "peak_heap_live_bytes", "peak_reserved_bytes", "allocator_s")}}
    return row


def configurations(dry_run: bool) -> list[dict]:
    cases = CPU_CASES if dry_run else GPU_CASES
    device = "cpu" if dry_run else "cuda"
    first = [(c, a) for c in cases for a in ALLOCATORS[:2]]
    last = [(c, ALLOCATORS[2]) for c in cases if c[2] == "smartpool"]
    return [{"model": m, "batch": b, "planner": p, "budget": budget, "allocator": a, "device": device,
             "dry_run": dry_run} for (m, b, p, budget), a in first + last]


def run_all(dry_run: bool, out_dir: Path, deadline_s: float) -> Path:
    """Every configuration in a fresh process, until the deadline; results written after each."""
    card = "cpu" if dry_run else _card()
    path = out_dir / f"pool_training_{card}.json"
    env = {**os.environ, "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", str(Path(tempfile.gettempdir()) / "numba")),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH")]))}
    started, rows = time.monotonic(), []
    for spec in configurations(dry_run):
        left = deadline_s - (time.monotonic() - started)
        if left < 5:
            rows.append({**spec, "status": "skipped: deadline"})
            continue
        rows.append(_spawn(spec, env, min(left, CHILD_LIMIT_S[card if card == "cpu" else "gpu"])))
        print(f"{_label(spec)}: {rows[-1].get('status')} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        _write(path, rows, card, dry_run, time.monotonic() - started)
    return path


def _spawn(spec: dict, env: dict, limit_s: float) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, env=env)
    except subprocess.TimeoutExpired:
        return {**spec, "status": f"timeout after {limit_s:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**spec, "status": f"failed: {tail[:300]}"}
    return {**json.loads(lines[-1]), "status": "ok"}


def _card() -> str:
    """A short name for the GPU (h100, h200, ...) from nvidia-smi, without a CUDA context here."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "gpu"
    found = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name)
    return found.group(1).lower() if found else re.sub(r"\W+", "_", name).lower()


def _label(spec: dict) -> str:
    return f"{spec['model']}@{spec['batch']} {spec['planner']} {spec['budget'] or ''} {spec['allocator']}".replace("  ", " ")


def _write(path: Path, rows: list[dict], card: str, dry_run: bool, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"card": card, "dry_run": dry_run, "seconds": seconds, "steps": STEPS, "timed_steps": TIMED_STEPS,
           "pool_search_s": POOL_SEARCH_S, "rows": rows}
    for target, text in ((path, json.dumps(doc, indent=1)), (path.with_suffix(".md"), _markdown(doc))):
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, target)


def _markdown(doc: dict) -> str:
    where = ("DRY RUN on the CPU: caching and expandable rows trained with PyTorch's CPU allocator, pool rows "
             "replayed a real CPU step's allocation requests through the host pool (the pool needs CUDA to serve "
             "training); the plumbing is checked, not GPU memory" if doc["dry_run"]
             else f"measured on one {doc['card'].upper()}")
    lines = [f"# Pool training ({where})", "",
             f"{doc['steps']} metered + {doc['timed_steps']} timed steps per run, each configuration in a fresh "
             f"process; {doc['seconds']:.0f} s in all. Reserved: torch's max_memory_reserved (caching, expandable) "
             "or the pool's own (pool block + its heap's most); step: median of the timed steps; vs caching: "
             "the same case's caching run.", "",
             "Pool columns (last step): slots served, fallbacks (requests at or above the smallest slot the "
             "pool did not serve: unseen library workspaces mostly), missed (planned storages not served at "
             "their slot), heap (most bytes the heap held), alloc (time inside the pool allocator).", "",
             "| model | plan | allocator | reserved MiB | vs caching | device used MiB | step s | vs caching "
             "| pool MiB | served/slots | fallbacks | missed | heap MiB | alloc ms/step | max param diff | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    caching = {(r["model"], r["planner"], r["budget"]): r for r in doc["rows"]
               if r["allocator"] == "caching" and r.get("status") == "ok"}
    for r in doc["rows"]:
        base = caching.get((r["model"], r["planner"], r["budget"]), {})
        pool = r.get("pool") or {}
        lines.append("| " + " | ".join([
            f"{r['model']}@{r['batch']}", f"{r['planner']} {r['budget'] or ''}".strip(), _allocator(r),
            _mib(r.get("peak_reserved_bytes")), _ratio(r.get("peak_reserved_bytes"), base.get("peak_reserved_bytes")),
            _mib(r.get("device_used_bytes")), _num(r.get("measured_step_s"), "{:.4f}"),
            _ratio(r.get("measured_step_s"), base.get("measured_step_s")), _mib(pool.get("pool_bytes")),
            f"{pool['served']}/{pool['slots']}" if pool else "-", _num(pool.get("fallbacks")),
            _num(pool.get("missed_slots")),
            _mib(pool.get("peak_heap_live_bytes")), _num(pool.get("allocator_s") and pool["allocator_s"] * 1e3,
                                                         "{:.2f}"),
            _num(r.get("max_param_diff"), "{:.3g}"), str(r.get("status"))]) + " |")
    return "\n".join(lines)


def _allocator(row: dict) -> str:
    ran = row.get("allocator_run")
    return row["allocator"] if ran in (None, row["allocator"]) else f"{row['allocator']} (ran: {ran})"


def _mib(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def _num(v, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for pool_training_<card>.{json,md}")
    p.add_argument("--dry-run", action="store_true", help="small models on the CPU: the plumbing only")
    p.add_argument("--deadline", type=float, help="seconds for all configurations (default 150 on a GPU, "
                                                   "1800 for --dry-run)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        sys.stderr.flush()
        os._exit(0)  # the result is out: no interpreter teardown under a replaced CUDA allocator
    deadline = args.deadline or DEADLINE_S["cpu" if args.dry_run else "gpu"]
    path = run_all(args.dry_run, args.out, deadline)
    print(path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

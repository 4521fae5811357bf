"""Shared by the GPU benchmarks (gpu_budget.py, gpu_speed.py): run groups of `memplan run`
cases, one fresh process per model, under a deadline, keeping what finished.

A group is one model: it is traced once (fake, each op timed alone on the device) and every
case of the group plans from that trace, in the same process (so the model's trace, numba's
compiled simulator and CUDA's start-up are paid once), each case building its own workload and
freeing it before the next. Results are JSON lines in OUT/NAME.jsonl; a case that fails keeps
its error. `--dry-run` runs small models on the CPU, to prove the plumbing without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback

GIB = 2**30
GROUP = "group"  # the case of a record about a whole group (its process failed)
# A case that fails and leaves more than this allocated ends its group's process: the parent starts
# the group again in a fresh one after that case (later cases measured beside the leftover would be
# wrong: on an H200 an out-of-memory case once left 2.2 GiB behind it).
LEFTOVER_BYTES = 64 * 2**20
RESUME = 3  # the exit code of a group process that asks to go on in a fresh one
_done_before = 0  # cases a resumed group process skips (done by the process before it)
_cases_seen = 0
RUN_KEYS = ("budget_bytes", "memory_cap_bytes", "trace_peak_bytes", "simulated_peak_bytes", "measured_peak_bytes",
            "measured_peak_reserved_bytes", "within_budget", "margin_bytes", "replanned", "final_plan_from_step",
            "measured_step_s", "simulated_step_s", "max_param_diff", "max_buffer_diff", "op_times", "trace_source")
EXEC_KEYS = ("diverged_steps", "skipped_ops", "inserted_ops", "unresolved", "swapped_out", "recomputed",
             "replayed_ops", "prefetch_wait_s", "release_wait_s", "level", "ops_in_mode", "regions_recomputed",
             "late_unpacks", "host_s", "steps_measured")


def parse(description: str, default_deadline_s: float) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True, help="folder for NAME.jsonl (and the report)")
    ap.add_argument("--deadline-s", type=float, default=default_deadline_s, help="all groups together")
    ap.add_argument("--dry-run", action="store_true", help="small models on the CPU")
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args()


def main(script: str, name: str, description: str, default_deadline_s: float, groups: list[str],
         group_main, report, limits: dict[str, float] | None = None) -> None:
    """A GPU benchmark's command line: as a parent, run every group in a fresh process of `script`
    (a group named in `limits` for at most that many seconds) and write OUT/NAME.md from
    `report(out)`; as a child (`--group`), `group_main(group, args)`."""
    args = parse(description, default_deadline_s)
    if args.group:
        global _done_before
        _done_before = args.skip
        group_main(args.group, args)
        return
    run_groups(script, name, groups, args, limits)
    text = report(args.out)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(text)
    print(text)


def run_groups(script: str, name: str, groups: list[str], args, limits: dict[str, float] | None = None) -> None:
    """Run each group in a fresh process of `script` until the deadline (a group in `limits`: at most
    that long, so that one slow group cannot take every later group's time)."""
    os.makedirs(args.out, exist_ok=True)
    end = time.time() + args.deadline_s
    for group in groups:
        group_end = min(end, time.time() + (limits or {}).get(group, float("inf")))
        skip = 0
        while True:  # a group process that asks for it goes on in a fresh one (LEFTOVER_BYTES)
            done = _run_group(script, name, group, args, group_end - time.time(), skip)
            if done is None or done.returncode != RESUME:
                break
            skip = int(done.stderr.strip().splitlines()[-1].split()[-1])


def _run_group(script: str, name: str, group: str, args, left: float, skip: int):
    """One process of `group` (its first `skip` cases done before); its CompletedProcess, or None."""
    if left < 10:
        emit(args.out, name, {"group": group, "skipped": "deadline"})
        return None
    cmd = [sys.executable, script, "--out", args.out, "--group", group, "--deadline-s", str(left), "--skip", str(skip)]
    try:
        done = subprocess.run(cmd + (["--dry-run"] if args.dry_run else []), timeout=left, check=False,
                              stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired as exc:
        emit(args.out, name, {"group": group, "case": GROUP, "error": f"the group timed out after {left:.0f} s",
                              "stderr_tail": _text(exc.stderr)[-3000:]})
        return None
    sys.stderr.write(done.stderr)
    if done.returncode and done.returncode != RESUME:  # a group that dies says why (a silent one cost a GPU run its rows)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        emit(args.out, name, {"group": group, "case": GROUP, "error": f"its process exited with "
                              f"{done.returncode}: {last}"[:600], "stderr_tail": done.stderr[-3000:]})
    return done


def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def group_notes(rows: list[dict]) -> list[str]:
    """Report lines for the groups whose process failed (they have no rows of their own)."""
    failed = [r for r in rows if r.get("case") == GROUP]
    return ["", *(f"Group {r['group']}: {r.get('error') or r.get('note')}" for r in failed)] if failed else []


def run_case(out: str, bench: str, group: str, case: dict, deadline: float, /, retry_on=None, **kwargs) -> dict:
    """One `run_workload(**kwargs)` case; its record (with `error` when it failed) is written to
    OUT/BENCH.jsonl and returned (not written when its error matches the pattern `retry_on`: the
    caller runs the case again). The step runs eagerly unless `cuda_graph` says otherwise: these
    benchmarks measure the executor (gpu_graph.py measures the captured step)."""
    import torch

    from memplan import run_workload

    global _cases_seen
    _cases_seen += 1
    rec = {"group": group, **case}
    if _cases_seen <= _done_before:  # done by the group's process before this one: its record
        return next((r for r in reversed(read(out, bench)) if all(r.get(k) == v for k, v in rec.items())), rec)
    if time.time() > deadline - 5:
        rec["skipped"] = "deadline"
        return emit(out, bench, rec)
    started = time.time()
    cuda = torch.cuda.is_available()
    if cuda:
        rec["allocated_before"] = torch.cuda.memory_allocated()
    kwargs.setdefault("cuda_graph", "off")
    try:
        res = run_workload(**kwargs)
        rec.update({k: res.get(k) for k in RUN_KEYS})
        rec["steps"] = [{k: s.get(k) for k in ("measured_peak_bytes", "measured_peak_reserved_bytes", "time_s")}
                        for s in res["steps"]]
        rec["timed_step_s"] = res.get("timed_step_s")
        rec["executor"] = {k: (res.get("executor") or {}).get(k) for k in EXEC_KEYS}  # none under a baseline
        rec["cuda_graph"] = graph_summary(res.get("cuda_graph"))
    except Exception as exc:  # noqa: BLE001 - a benchmark keeps going and records why
        rec["failed_at"], rec["error"] = failed_at(exc), failure(exc)[:600]
        rec["traceback"] = traceback.format_exc()[-1500:]
    rec["wall_s"] = round(time.time() - started, 2)
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if retry_on is not None and retry_on.match(rec.get("error") or ""):
        return rec
    emit(out, bench, rec)
    leftover = torch.cuda.memory_allocated() - rec["allocated_before"] if cuda else 0
    if "error" in rec and leftover > LEFTOVER_BYTES:
        emit(out, bench, {"group": group, "case": GROUP, "note": f"{case} left {gib(leftover)} GiB allocated: "
                          f"the group goes on in a fresh process"})
        print(f"resume after {_cases_seen}", file=sys.stderr, flush=True)
        sys.exit(RESUME)
    return rec


def failure(exc: BaseException) -> str:
    """A failed case's first error in one line: the root of the exception chain (a later one is often only
    "due to a previous error"), naming the last when it differs."""
    first = exc
    while (first.__cause__ or first.__context__) is not None:
        first = first.__cause__ or first.__context__

    def line(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"

    return line(first) + ("" if first is exc else f" (then {line(exc)})")


def failed_at(exc: BaseException) -> str:
    """The step a failed case's error came from: memplan's measure loops number it, a CUDA graph names
    its call (warm-up k, the capture, replay k); none: before the first step (tracing, planning)."""
    step, phase = getattr(exc, "memplan_step", None), getattr(exc, "memplan_phase", None)
    return "before the first step" if step is None else f"step {step}" + (f" ({phase})" if phase else "")


def error_of(rec: dict) -> str:
    """A row's error for a report: where it came from, then what it was ("" for none)."""
    error = rec.get("error") or ""
    return f"{rec['failed_at']}: {error}" if error and rec.get("failed_at") else error


def graph_summary(graph: dict | None) -> dict | None:
    """A run's `cuda_graph` report without the schedule's per-copy lists (their totals stay)."""
    if not graph:
        return graph
    schedule = {k: v for k, v in graph["schedule"].items() if k not in ("events", "recomputations", "static_inputs")}
    return {**{k: v for k, v in graph.items() if k != "schedule"}, "schedule": schedule}


def emit(out: str, name: str, rec: dict) -> dict:
    if _done_before and rec.get("case") in ("env", "plain", "trace"):
        return rec  # a resumed group's process: the first one wrote these
    with open(os.path.join(out, f"{name}.jsonl"), "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    short = {k: rec.get(k) for k in ("group", "case", "planner", "error", "within_budget", "measured_peak_bytes",
                                      "measured_step_s", "wall_s") if rec.get(k) is not None}
    print(json.dumps(short, default=str), flush=True)
    return rec


def read(out: str, name: str) -> list[dict]:
    path = os.path.join(out, f"{name}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def device_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "device": "cuda" if torch.cuda.is_available() else "cpu"}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, total_memory=p.total_memory, capability=f"{p.major}.{p.minor}",
                    tf32_cudnn=torch.backends.cudnn.allow_tf32, tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return info


def trace_once(model: str, batch: int, device: str, config: dict):
    """The fake trace every case of a group plans from (ops timed alone on a GPU)."""
    from memplan import trace_workload

    return trace_workload(model, batch, fake=True, device=device, time_ops=device == "cuda", **config)



def machine(rows: list[dict]) -> str:
    """The card and torch a results file was measured with, as report titles name them."""
    env = next((r for r in rows if r.get("case") == "env"), {})
    return f"{env.get('gpu', env.get('device', '?'))}, torch {env.get('torch', '?')}"


def table_row(cells) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(x) for x in cells) + " |"


def gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.3f}"

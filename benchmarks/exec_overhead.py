"""The executor's own cost per op on the CPU (issue 25's CPU proxy), against another commit.

A model of many tiny ops (kernels of a few microseconds, so what is measured is the
executor's Python, as on a GPU, where kernels run asynchronously) trains under:

- `plain`: no memplan;
- `none`: memplan with nothing to do (a program without actions);
- `guarded`: a program with one swap of a storage away for most of the step (so every op
  is checked against storages away: the executor's busiest path without doing work);
- `sqrt-n`: recomputation by op replay;
- `empty mode`: no memplan, a PyTorch dispatch mode that only calls each op: the floor of any
  executor that sees every op.

Reported: microseconds per op of `none` and of `guarded` over plain, and microseconds per
replayed op of `sqrt-n` over `guarded` (both run the executor at every op; the difference is
recording the calls to replay and replaying them, the replayed kernels included), each the
median of alternating rounds. `--ref COMMIT` runs the same measurement on that commit's memplan (a
temporary git worktree, in a subprocess) in the same run, so the ratios compare like with like.

    python benchmarks/exec_overhead.py --ref e0c6f39 --out benchmarks/results/exec_overhead

`--device cuda` measures the same on a GPU (its kernels are as tiny: what is measured is the
host's work per op, which a GPU step of short kernels cannot hide).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, DEPTH, BATCH = 16, 48, 4  # tiny Linear+ReLU layers: ~580 ops a step
ROUNDS, STEPS = 7, 5


def build(device: str = "cpu"):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return model, opt, step, (x, y)


def one_swap_plan(trace):
    """A plan that swaps one activation out over the longest gap between two of its accesses."""
    from memplan import Decision, Plan

    gaps = []
    for s in trace.storages:
        if s.kind == "activation" and s.nbytes > 0:
            acc = trace.accesses[s.id]
            gaps += [(b - a, s.id, a, b) for a, b in zip(acc, acc[1:])]
    _, sid, out_after, back_before = max(gaps)
    return Plan(decisions=(Decision(storage=sid, action="swap", out_after=out_after, back_before=back_before),))


def measure(device: str = "cpu") -> dict:
    import torch

    from memplan import optimize
    from memplan.services import trace_step

    torch.set_num_threads(1)
    model, opt, step, inputs = build(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    trace = trace_step(step, inputs, model, opt)
    runs = {"plain": step, "empty mode": _in_empty_mode(step)}
    # the dispatch-mode executor's own costs, eager (a captured step would hide them)
    eager = {"model": model, "optimizer": opt, "measure": False, "cuda_graph": "off"}
    runs["none"] = optimize(step, *inputs, trace=trace, planner="none", **eager)
    runs["guarded"] = optimize(step, *inputs, trace=trace, plan=one_swap_plan(trace), executor="interpreted", **eager)
    runs["sqrt-n"] = optimize(step, *inputs, trace=trace, planner="sqrt-n", executor="interpreted", **eager)
    times = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, fn in runs.items():
            fn(*inputs)  # warm
            sync()
            start = time.perf_counter()
            for _ in range(STEPS):
                fn(*inputs)
            sync()
            times[name].append((time.perf_counter() - start) / STEPS)
    med = {name: statistics.median(t) for name, t in times.items()}
    stats = runs["sqrt-n"].stats()
    replayed = stats["replayed_ops"] / max(stats["steps"], 1)
    guarded = runs["guarded"].stats()
    for name, fn in runs.items():
        if hasattr(fn, "close"):
            fn.close()
    n = len(trace.ops)
    return {"ops_per_step": n, "replayed_ops_per_step": replayed, "step_s": med,
            "guarded_swaps": guarded["swapped_out"], "guarded_diverged": guarded["diverged_steps"],
            "us_per_op_none": (med["none"] - med["plain"]) / n * 1e6,
            "us_per_op_guarded": (med["guarded"] - med["plain"]) / n * 1e6,
            "us_per_op_empty_mode": (med["empty mode"] - med["plain"]) / n * 1e6,
            # over `guarded`, which also runs the mode at every op: what recording and replaying cost
            "us_per_replayed_op": (med["sqrt-n"] - med["guarded"]) / max(replayed, 1) * 1e6}


def _in_empty_mode(step):
    """`step` under a dispatch mode that does nothing but run each op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class EmptyMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def run(*inputs):
        with EmptyMode():
            step(*inputs)

    return run


def at_commit(commit: str, device: str) -> dict:
    """The same measurement, run by this script on `commit`'s memplan."""
    with tempfile.TemporaryDirectory(prefix="memplan-ref-") as folder:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", folder, commit], check=True)
        try:
            env = {**os.environ, "PYTHONPATH": folder}
            out = subprocess.run([sys.executable, __file__, "--measure", "--device", device], env=env, check=True, capture_output=True,
                                 text=True, cwd=folder)
            return json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", folder], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", help="also measure this commit (e.g. e0c6f39)")
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model trains")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.device)))
        return
    rows = {"this": measure(args.device)}
    if args.ref:
        rows[args.ref] = at_commit(args.ref, args.device)
    report = {"host": os.uname().nodename, "cpu_threads": 1, "device": args.device, "gpu": _gpu_name(args.device),
              "model": f"{DEPTH}x(Linear({WIDTH})+ReLU), batch {BATCH}", "rows": rows}
    text = _markdown(report)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out + ".md").write_text(text)


def _gpu_name(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else None


def _markdown(report: dict) -> str:
    where = report.get("gpu") or "the CPU"
    lines = [f"Executor overhead on {where}, {report['model']}, one host thread (measured; median of {ROUNDS} rounds)",
             "",
             "| memplan | ops/step | plain step ms | us/op empty mode | us/op none | us/op guarded | "
             "us per replayed op (sqrt-n over guarded) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in report["rows"].items():
        lines.append(f"| {name} | {r['ops_per_step']} | {r['step_s']['plain'] * 1e3:.2f} | "
                     f"{r['us_per_op_empty_mode']:.1f} | {r['us_per_op_none']:.1f} | "
                     f"{r['us_per_op_guarded']:.1f} | {r['us_per_replayed_op']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

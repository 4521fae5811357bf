"""How many plans home:fast and auto evaluate in their time limit (issue 49: >= 10x 85716aa's).

Each planner plans resnet50 at batch 256 (fake tensors) at a third of its peak on the h100 profile,
20 s, one core, in a fresh process; every evaluation is counted by wrapping the simulator's
evaluating methods (`Simulator.run`, and `time_if_fits` where the revision has it), since an older
revision's reports carry no `evaluations`. With --against REV the same runs alternate with those of a
checkout of REV in a temporary git worktree (its own tracer's trace), so both come from one sitting.
Each planner first runs untimed in each checkout: a fresh worktree compiles its numba kernels on its
first run, which took half of a 20 s run's time.

    python benchmarks/search_rate.py [--against 85716aa] [--rounds 2] [--write]

--write puts the result in benchmarks/results/search_rate.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from memplan.fileio import atomic_write_text

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PLANNERS = ("home:fast", "auto")
SECONDS = 20.0
TARGET = 10.0  # times the evaluations of 85716aa (issue 49)
WARM_UP_S = 2.0  # an untimed run of each planner in each checkout first (a fresh worktree compiles its kernels)

# One planning run, in the checkout on sys.path: its evaluations counted at the simulator.
COUNT = """
import json, os, sys, time
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import memplan
from memplan.sim import simulate
counted = [0]
for name in ("run", "time_if_fits"):
    method = getattr(simulate.Simulator, name, None)
    if method is not None:
        def wrapped(self, *args, _method=method, **kwargs):
            counted[0] += 1
            return _method(self, *args, **kwargs)
        setattr(simulate.Simulator, name, wrapped)
planner, seconds = sys.argv[1], float(sys.argv[2])
trace = memplan.trace_workload("resnet50", 256, fake=True)
params = {"time_limit_s": seconds, **({"workers": 1} if planner.startswith("home") else {})}
counted[0], started = 0, time.perf_counter()
plan = memplan.plan(trace, budget=1 / 3, planner=planner, profile="h100", **params)
print(json.dumps({"evaluations": counted[0], "wall_s": time.perf_counter() - started,
                  "overhead": plan.predicted["overhead"], "load": os.getloadavg()[0]}))
"""


def count(tree: Path, planner: str, seconds: float) -> dict:
    """One planning run of `planner` in the checkout at `tree`, pinned to one core where the OS allows."""
    pin = ["taskset", "-c", "0"] if sys.platform.startswith("linux") else []
    out = subprocess.run([*pin, sys.executable, "-c", COUNT, planner, str(seconds)], cwd=tree, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(against: str | None, rounds: int, seconds: float) -> dict:
    """Per planner, this checkout's runs and (with `against`) the other revision's, alternating."""
    runs: dict = {p: {"this": [], "against": []} for p in PLANNERS}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "tree"
        if against:
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), against], check=True,
                           capture_output=True)
        try:
            for planner in PLANNERS:  # untimed: each checkout compiles its numba kernels into its cache first
                for tree in ([old] if against else []) + [REPO]:
                    count(tree, planner, WARM_UP_S)
            for _ in range(rounds):
                for planner in PLANNERS:
                    if against:
                        runs[planner]["against"].append(count(old, planner, seconds))
                    runs[planner]["this"].append(count(REPO, planner, seconds))
        finally:
            if against:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=True,
                               capture_output=True)
    return runs


def to_markdown(out: dict) -> str:
    rev = out.get("against") or "-"
    lines = [f"| planner | evaluations in {out['seconds']:.0f} s (this revision) | at {rev} | ratio | per second "
             f"(this / {rev}) | overhead found |", "|---|---|---|---|---|---|"]
    def counts(runs: list) -> str:
        return ", ".join(f"{r['evaluations']:,}" for r in runs) or "-"

    for planner, row in out["planners"].items():
        this, old = row["this"], row["against"]
        ratio = f"{row['ratio']:.1f}x" if old else "-"
        rates = " / ".join(f"{statistics.median(r['evaluations'] / r['wall_s'] for r in runs):,.0f}"
                           for runs in (this, old) if runs)
        lines.append(f"| {planner} | {counts(this)} | {counts(old)} | {ratio} | {rates} | {this[-1]['overhead']:.2%} |")
    return "\n".join(lines) + (f"\n\nTarget: {TARGET:.0f}x the evaluations of 85716aa; load average "
                               f"{out['load_average']:.1f}.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="also run this git revision, alternating with this checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=SECONDS, help="each planner's time limit")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/search_rate.{json,md}")
    args = parser.parse_args()
    runs = measure(args.against, args.rounds, args.seconds)
    planners = {}
    for planner, row in runs.items():
        this, old = row["this"], row["against"]
        ratio = statistics.median(r["evaluations"] for r in this) / statistics.median(r["evaluations"] for r in old) \
            if old else None
        planners[planner] = {**row, "ratio": ratio}
    out = {"against": args.against, "seconds": args.seconds, "target_ratio": TARGET, "planners": planners,
           "trace": "resnet50 batch 256 (fake), a third of its peak, h100", "load_average": os.getloadavg()[0]}
    if args.write:
        atomic_write_text(RESULTS / "search_rate.json", json.dumps(out, indent=1) + "\n")
        atomic_write_text(RESULTS / "search_rate.md", to_markdown(out))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

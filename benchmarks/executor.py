"""Executor benchmark: measured step time and peak memory under plans vs the simulator.

Run on a GPU (results are only meaningful there):
    python benchmarks/executor.py --device cuda --out benchmarks/results/executor_h100.json
"""

from __future__ import annotations

import argparse
import json
import logging

from memplan import UNLIMITED, run_workload
from memplan.workflows.torch_tools import BASELINES
from memplan.fileio import atomic_write_text

MODELS = (("resnet50", 64, {}), ("hf:gpt2", 8, {}))
BUDGETS = ("75%", "50%")
PLANNERS = ("none", "save-on-cpu", "checkpoint-all", "sqrt-n", "autoswap:swdoa")


def main() -> None:
    """Measure every (model, planner, budget) and write one JSON file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/executor.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    rows = []
    cells = [(p, None) for p in PLANNERS] + [(None, b) for b in BASELINES]
    for name, batch, config in MODELS:
        for planner, baseline in cells:
            for budget in BUDGETS if planner != "none" else (UNLIMITED,):
                try:
                    rows.append(run_workload(name, batch, planner=planner or "none", budget=budget, steps=args.steps,
                                             device=args.device, config=config, baseline=baseline, check=True))
                except Exception as exc:  # one failing cell must not lose the others
                    rows.append({"model": name, "planner": planner or baseline, "budget": str(budget), "error": str(exc)})
    atomic_write_text(args.out, json.dumps({"rows": rows}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()

"""Regenerate the pool tables: every allocator on the minimalloc challenging problems and on
model traces (paper 000 Table I style).

    .venv/bin/python benchmarks/pool.py [--time-limit 10] [--passes 2] [--skip-models] [--skip-challenging]

smartpool runs as a user runs it: `memplan pool FILE --allocator smartpool --time-limit T` in a
fresh process each time (cold: the wall time of the whole command, interpreter start-up
included), then once more inside this process after a first call (warm: the call alone). The
host's load average is recorded with every row, since other work on the machine slows the
search. Writes benchmarks/results/pool_challenging.csv and pool_models.csv.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from memplan.services import read_minimalloc_csv, solve_pool, storage_pool_problem
from memplan.pool.native import library
from memplan.fileio import atomic_write_text

DATA = Path(__file__).resolve().parents[1] / "data" / "minimalloc-challenging"  # vendored, see its SOURCE.md
RESULTS = Path(__file__).parent / "results"
BASELINES = ("smartpool-bestfit", "smartpool-firstfit", "cnmem", "caching", "caching-expandable", "vdnnpp-highend")
MODELS = (("vgg16", 100, 32), ("resnet50", 100, 32), ("resnet50", 256, 224))  # name, batch, input side
MEMPLAN = Path(sys.executable).with_name("memplan")
# Fresh processes cache bytecode as an installed package does (this workspace's shell sets
# PYTHONDONTWRITEBYTECODE, which would make every cold run compile memplan's modules again).
FRESH_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cold_run(path: Path, time_limit: float) -> dict:
    """`memplan pool PATH --allocator smartpool` in a fresh process: ratio, details, wall seconds."""
    started = time.monotonic()
    out = subprocess.run([str(MEMPLAN), "pool", str(path), "--allocator", "smartpool", "--time-limit", str(time_limit),
                          "--json"], capture_output=True, text=True, check=True, env=FRESH_ENV).stdout
    wall = time.monotonic() - started
    return {**json.loads(out), "wall_s": wall}


def challenging(time_limit: float, passes: int) -> list[dict]:
    """smartpool cold (per pass) and warm, and every baseline, on the 11 files."""
    library()  # built once per machine and source version, before anything is timed
    solve_pool(read_minimalloc_csv(DATA / "A.1048576.csv"), "smartpool", time_limit_s=time_limit)  # warm this process
    rows = []
    for path in sorted(DATA.glob("[A-K].1048576.csv")):
        problem = read_minimalloc_csv(path)
        row = {"file": path.name.split(".")[0], "buffers": problem.n, "peak_load": problem.peak_load_bytes,
               "load_avg": round(os.getloadavg()[0], 1)}
        colds = [cold_run(path, time_limit) for _ in range(passes)]
        row["smartpool"] = round(float(np.mean([c["ratio"] for c in colds])), 4)
        row["smartpool_passes"] = " ".join(str(round(c["ratio"], 4)) for c in colds)
        row["cold_wall_s"] = round(max(c["wall_s"] for c in colds), 2)
        warm = solve_pool(problem, "smartpool", time_limit_s=time_limit)
        row["warm_s"] = round(warm.seconds, 3)
        row["lower_bound"] = colds[-1]["details"]["lower_bound"]
        row["search"] = colds[-1]["details"]["search"]
        for name in BASELINES:
            row[name] = round(solve_pool(problem, name).ratio, 4)
        rows.append(row)
        print(row, flush=True)
    return rows


def models(time_limit: float) -> list[dict]:
    """Allocator ratios on fake-traced model iterations (paper 000 Table I)."""
    from memplan import trace_workload

    rows = []
    for name, batch, side in MODELS:
        trace = trace_workload(name, batch, fake=True, input_size=side)
        problem = storage_pool_problem(trace)
        row = {"model": f"{name}@{batch}x{side}", "buffers": problem.n, "peak_load_MiB": round(problem.peak_load_bytes / 2**20, 1)}
        for alloc in ("smartpool", "smartpool-bestfit", "cnmem", "caching", "caching-expandable"):
            result = solve_pool(problem, alloc, time_limit_s=time_limit)
            row[alloc] = round(result.ratio, 4)
        rows.append(row)
        print(row, flush=True)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(rows[0])
    lines = [",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys) for r in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--passes", type=int, default=2, help="cold smartpool runs per file")
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--skip-challenging", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.skip_challenging:
        rows = challenging(args.time_limit, args.passes)
        mean = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in ("smartpool", *BASELINES)}
        write_csv(RESULTS / "pool_challenging.csv", rows + [{"file": "mean", **mean}])
    if not args.skip_models:
        write_csv(RESULTS / "pool_models.csv", models(args.time_limit))


if __name__ == "__main__":
    main()

"""smartpool on large problems, and how its search scales with threads.

    .venv/bin/python benchmarks/pool_large.py [--time-limit 60] [--sizes 20000,50000,100000] [--skip-threads]

Large: the 60,000-buffer problem tiled from a resnet50 trace, and synthetic problems of both
families of memplan.pool.synthetic at each size (generated here, seed 0). Each runs in a fresh
process, which reports its wall time and peak resident memory. Threads: nodes/s and ratio of
the search at 1, 2 and 4 threads on the challenging files the search cannot finish (D, J) and
on B (time to its optimum). The host's load average is recorded with every row.
Writes benchmarks/results/pool_large.csv and pool_threads.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from memplan.services import read_minimalloc_csv, solve_pool, storage_pool_problem
from memplan.pool.problem import make_problem
from memplan.pool.synthetic import FAMILIES, synthetic_problem

sys.path.insert(0, str(Path(__file__).parent))
from pool import DATA, RESULTS, write_csv  # noqa: E402  (the sibling benchmark)

TILED_BUFFERS = 60_000
THREADS = (1, 2, 4)
THREAD_FILES = ("B", "D", "J")


def tiled(problem, copies: int):
    """`copies` iterations of a problem back to back in time (persistent buffers stay one buffer)."""
    horizon = problem.horizon
    persistent = (problem.starts == 0) & (problem.ends == horizon)
    body = ~persistent
    starts = [problem.starts[persistent]] + [problem.starts[body] + k * horizon for k in range(copies)]
    ends = [problem.ends[persistent] + (copies - 1) * horizon] + [problem.ends[body] + k * horizon for k in range(copies)]
    sizes = [problem.sizes[persistent]] + [problem.sizes[body]] * copies
    return make_problem(np.concatenate(starts), np.concatenate(ends), np.concatenate(sizes), source="tiled")


def tiled_problem():
    """A 60,000-buffer problem tiled from a resnet50@32x224 trace."""
    from memplan import trace_workload

    base = storage_pool_problem(trace_workload("resnet50", 32, fake=True, input_size=224))
    persistent = int(((base.starts == 0) & (base.ends == base.horizon)).sum())
    copies = -(-(TILED_BUFFERS - persistent) // (base.n - persistent))
    return tiled(base, copies).subset(np.arange(TILED_BUFFERS))


def one(name: str, time_limit: float) -> dict:
    """Solve one large problem in this process (run in a fresh one): ratio, seconds, peak memory."""
    if name == "tiled":
        problem = tiled_problem()
    else:
        family, size = name.split(":")
        problem = synthetic_problem(family, int(size))
    started = time.monotonic()
    result = solve_pool(problem, "smartpool", time_limit_s=time_limit)
    wall = time.monotonic() - started
    details = result.details
    return {"problem": name, "buffers": problem.n, "ratio": round(result.ratio, 4), "solve_s": round(wall, 1),
            "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "first_layout": details["portfolio"], "first_ratio": round(details["portfolio_footprint"] / result.peak_load_bytes, 4),
            "search": details["search"]}


def large(time_limit: float, sizes: list[int]) -> list[dict]:
    rows = []
    for name in ["tiled"] + [f"{family}:{n}" for n in sizes for family in FAMILIES]:
        load = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--one", name, "--time-limit", str(time_limit)],
                             capture_output=True, text=True, check=True).stdout
        row = {**json.loads(out.splitlines()[-1]), "load_avg": round(load, 1)}
        rows.append(row)
        print(row, flush=True)
    return rows


def threads(time_limit: float) -> list[dict]:
    """The search at 1, 2 and 4 threads: ratio, search nodes per second, seconds."""
    rows = []
    for name in THREAD_FILES:
        problem = read_minimalloc_csv(DATA / f"{name}.1048576.csv")
        for count in THREADS:
            load = os.getloadavg()[0]
            result = solve_pool(problem, "smartpool", time_limit_s=time_limit, threads=count)
            rows.append({"file": name, "threads": count, "ratio": round(result.ratio, 4), "seconds": round(result.seconds, 2),
                         "search_nodes": result.details.get("search_nodes", 0),
                         "nodes_per_s": result.details.get("nodes_per_s", 0), "load_avg": round(load, 1)})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="per large problem")
    parser.add_argument("--thread-time-limit", type=float, default=10.0, help="per file and thread count")
    parser.add_argument("--sizes", default="20000,50000,100000")
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-threads", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: solve one problem in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.time_limit)))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.skip_large:
        write_csv(RESULTS / "pool_large.csv", large(args.time_limit, [int(s) for s in args.sizes.split(",")]))
    if not args.skip_threads:
        write_csv(RESULTS / "pool_threads.csv", threads(args.thread_time_limit))


if __name__ == "__main__":
    main()

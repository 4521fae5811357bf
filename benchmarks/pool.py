"""Regenerate the pool tables: every allocator on the minimalloc challenging problems and on
model traces (paper 000 Table I style), plus smartpool's time on a 60,000-buffer problem.

    .venv/bin/python benchmarks/pool.py [--time-limit 10] [--skip-models] [--skip-challenging]

Writes benchmarks/results/pool_challenging.csv, pool_models.csv, pool_large.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

import memplan.pool as mp
from memplan.pool.problem import from_storages, make_problem
from memplan.fileio import atomic_write_text

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "minimalloc-challenging"  # ../shared beside the repo
RESULTS = Path(__file__).parent / "results"
ALLOCATORS = ("smartpool", "smartpool-bestfit", "smartpool-firstfit", "cnmem", "caching", "caching-expandable",
              "vdnnpp-highend")
MODELS = (("vgg16", 100, 32), ("resnet50", 100, 32), ("resnet50", 256, 224))  # name, batch, input side
LARGE_BUFFERS = 60_000


def warm_up() -> float:
    """Compile the search kernel once (numba cannot cache it on disk); returns the seconds it took."""
    from memplan.pool.search import compile_kernel

    started = time.perf_counter()
    compile_kernel()
    return time.perf_counter() - started


def challenging(time_limit: float) -> list[dict]:
    """Every allocator on the 11 challenging files."""
    print(f"search kernel compiled in {warm_up():.1f} s (once per process, not in the times below)", flush=True)
    rows = []
    for path in sorted(DATA.glob("[A-K].1048576.csv")):
        problem = mp.read_minimalloc_csv(path)
        row = {"file": path.name.split(".")[0], "buffers": problem.n, "peak_load": problem.peak_load_bytes}
        for name in ALLOCATORS:
            result = mp.solve(problem, name, time_limit_s=time_limit)
            row[name] = round(result.ratio, 4)
            if name == "smartpool":
                row["smartpool_s"] = round(result.seconds, 2)
                row["smartpool_lower_bound"] = result.details.get("lower_bound", "")
        rows.append(row)
        print(row, flush=True)
    return rows


def models(time_limit: float) -> list[dict]:
    """Allocator ratios on fake-traced model iterations (paper 000 Table I)."""
    from memplan.workflows.workloads import trace_workload

    rows = []
    for name, batch, side in MODELS:
        trace = trace_workload(name, batch, fake=True, input_size=side)
        problem = from_storages(trace)
        row = {"model": f"{name}@{batch}x{side}", "buffers": problem.n, "peak_load_MiB": round(problem.peak_load_bytes / 2**20, 1)}
        for alloc in ("smartpool", "smartpool-bestfit", "cnmem", "caching", "caching-expandable"):
            result = mp.solve(problem, alloc, time_limit_s=time_limit)
            row[alloc] = round(result.ratio, 4)
        rows.append(row)
        print(row, flush=True)
    return rows


def tiled(problem, copies: int):
    """`copies` iterations of a problem back to back in time (persistent buffers stay one buffer)."""
    horizon = problem.horizon
    persistent = (problem.starts == 0) & (problem.ends == horizon)
    body = ~persistent
    starts = [problem.starts[persistent]] + [problem.starts[body] + k * horizon for k in range(copies)]
    ends = [problem.ends[persistent] + (copies - 1) * horizon] + [problem.ends[body] + k * horizon for k in range(copies)]
    sizes = [problem.sizes[persistent]] + [problem.sizes[body]] * copies
    return make_problem(np.concatenate(starts), np.concatenate(ends), np.concatenate(sizes), source="tiled")


def large(time_limit: float) -> dict:
    """smartpool and best-fit on a 60,000-buffer problem tiled from a resnet50 trace."""
    from memplan.workflows.workloads import trace_workload

    base = from_storages(trace_workload("resnet50", 32, fake=True, input_size=224))
    persistent = int(((base.starts == 0) & (base.ends == base.horizon)).sum())
    copies = -(-(LARGE_BUFFERS - persistent) // (base.n - persistent))
    problem = tiled(base, copies)
    problem = problem.subset(np.arange(min(problem.n, LARGE_BUFFERS)))
    out = {"buffers": problem.n, "source": f"resnet50@32x224 tiled x{copies}"}
    for alloc in ("smartpool-bestfit", "smartpool"):
        started = time.perf_counter()
        result = mp.solve(problem, alloc, time_limit_s=time_limit)
        out[alloc] = {"ratio": round(result.ratio, 4), "seconds": round(time.perf_counter() - started, 2)}
    print(out, flush=True)
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(rows[0])
    lines = [",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys) for r in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--skip-challenging", action="store_true")
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.skip_challenging:
        rows = challenging(args.time_limit)
        mean = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in (*ALLOCATORS, "smartpool_s")}
        write_csv(RESULTS / "pool_challenging.csv", rows + [{"file": "mean", **mean}])
    if not args.skip_models:
        write_csv(RESULTS / "pool_models.csv", models(args.time_limit))
    if not args.skip_large:
        atomic_write_text(RESULTS / "pool_large.json", json.dumps(large(args.time_limit), indent=1) + "\n")


if __name__ == "__main__":
    main()

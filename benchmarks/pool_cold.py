"""Cold start of `memplan pool FILE --allocator smartpool`: wall time of a fresh process, next to
two floors measured on the same host at the same moment: interpreter start-up plus `import
numpy`, and the same command with `--allocator exact` (the CLI, loading and validation, no
layout work).

    .venv/bin/python benchmarks/pool_cold.py [--runs 5] [--files CEFGHK]

The files default to those smartpool solves in its first search round. Each row: median and
worst wall over the runs, the floors' medians, and the load average. Bytecode is cached as in an
installed package (see pool.FRESH_ENV); the first run of each file warms that cache. Writes
benchmarks/results/pool_cold.csv.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from pool import DATA, FRESH_ENV, MEMPLAN, RESULTS, write_csv  # noqa: E402  (the sibling benchmark)

from memplan.pool.native import library  # noqa: E402


def wall(cmd: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(cmd, capture_output=True, check=True, env=FRESH_ENV)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", default="CEFGHK")
    args = parser.parse_args()
    library()  # built once per machine, never inside a timed run
    floor_cmd = [sys.executable, "-c", "import numpy"]
    rows = []
    for name in args.files:
        cmd = [str(MEMPLAN), "pool", str(DATA / f"{name}.1048576.csv"), "--allocator", "smartpool", "--json"]
        load = os.getloadavg()[0]
        exact_cmd = cmd[:3] + ["--allocator", "exact", "--json"]
        cold, floor, exact = [], [], []
        wall(cmd)  # bytecode cache and page cache, as after an install
        for _ in range(args.runs):
            cold.append(wall(cmd))
            floor.append(wall(floor_cmd))
            exact.append(wall(exact_cmd))
        rows.append({"file": name, "cold_median_s": round(statistics.median(cold), 2), "cold_max_s": round(max(cold), 2),
                     "python_numpy_median_s": round(statistics.median(floor), 2),
                     "cli_exact_median_s": round(statistics.median(exact), 2), "load_avg": round(load, 1)})
        print(rows[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_csv(RESULTS / "pool_cold.csv", rows)


if __name__ == "__main__":
    main()

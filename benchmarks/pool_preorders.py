"""Which static preorders solve the challenging pool problems at peak load, and how fast.

Every three-letter order of minimalloc's letters (A area, C sections, L start, O overlaps,
T section total, U end, W width, Z size: 336 orders) runs alone, single-threaded, on each
of the 11 minimalloc challenging files at capacity = peak load, with a time limit per run.
The search's PREORDERS were chosen from this table (a small set covering the solvable files).

    .venv/bin/python benchmarks/pool_preorders.py [--seconds 0.4] [--jobs 2]

Writes benchmarks/results/pool_preorder_screen.md and .json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from memplan.services import read_minimalloc_csv
from memplan.pool.greedy import conflict_graph
from memplan.pool.search import FOUND, PREORDERS, _Searcher, compile_kernel
from memplan.fileio import atomic_write_text

DATA = Path(__file__).resolve().parents[1] / "data" / "minimalloc-challenging"  # vendored, see its SOURCE.md
RESULTS = Path(__file__).parent / "results"
LETTERS = "ACLOTUWZ"
SHOWN = 6  # fastest orders listed per file in the table


def screen_file(path: Path, seconds: float) -> tuple[str, dict]:
    """Seconds to a layout at peak load for every order that found one within `seconds`."""
    compile_kernel()
    problem = read_minimalloc_csv(path)
    orders = ["".join(letters) for letters in itertools.permutations(LETTERS, 3)]
    searcher = _Searcher(problem, conflict_graph(problem), preorders=tuple(orders))
    found = {}
    for k, letters in enumerate(orders):
        started = time.perf_counter()
        status, _ = searcher.run(problem.peak_load_bytes, k, 2**62, time.monotonic() + seconds)
        if status == FOUND:
            found[letters] = round(time.perf_counter() - started, 3)
    return path.name.split(".")[0], found


def table(results: dict, seconds: float) -> str:
    lines = [f"# Preorders that reach peak load within {seconds} s (single thread, one order at a time)", "",
             "`python benchmarks/pool_preorders.py`; the search's PREORDERS: " + ", ".join(PREORDERS), "",
             "| file | orders that solve it (of 336) | fastest | solved by PREORDERS |", "| --- | --- | --- | --- |"]
    for name, found in sorted(results.items()):
        fastest = ", ".join(f"{k} {v} s" for k, v in sorted(found.items(), key=lambda kv: kv[1])[:SHOWN])
        ours = ", ".join(k for k in PREORDERS if k in found)
        lines.append(f"| {name} | {len(found)} | {fastest or '-'} | {ours or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.4)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    files = sorted(DATA.glob("[A-K].1048576.csv"))
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(screen_file, files, [args.seconds] * len(files)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS / "pool_preorder_screen.json", json.dumps(results, indent=1) + "\n")
    atomic_write_text(RESULTS / "pool_preorder_screen.md", table(results, args.seconds))
    print(table(results, args.seconds))


if __name__ == "__main__":
    main()

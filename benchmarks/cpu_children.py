"""What the CPU speed benchmarks share: a calibrated one-thread profile, and one configuration run
in a fresh process on one host thread (so no run inherits another's allocator or caches).

A benchmark script runs itself as the child (`SCRIPT --one ARGS...`), which prints its record as
the last line of its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def calibrate(out: Path) -> str:
    """A calibrated CPU profile (one thread), written beside the results; its path."""
    path = out.with_name(out.name + "_cpu.json")
    subprocess.run([sys.executable, "-m", "memplan", "calibrate", "--device", "cpu", "-o", str(path)],
                   check=True, capture_output=True, env={**os.environ, **ONE_THREAD})
    return str(path)


def run_child(script: str, args: list, failed: dict) -> dict:
    """`script --one ARGS` in a fresh one-thread process: its record, or `failed` with the child's
    last line of error."""
    cmd = [sys.executable, script, "--one", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ONE_THREAD}, check=False)
    if done.returncode != 0:
        return {**failed, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_results(out: Path, result: dict, summarize, markdown) -> None:
    """OUT.json (the runs and their summary rows) and OUT.md (the table), printed too."""
    rows = summarize(result)
    result["rows"] = rows
    text = markdown(result, rows)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)

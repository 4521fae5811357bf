"""`pytest -m gpu` inside a GPU run, its outcome per test kept as JSON (issue 36).

    python benchmarks/gpu_pytest.py --out DIR [--timeout-s 90] [PYTEST_ARG...]

Writes DIR/gpu_pytest.json: the card (or "cpu"), pytest's exit code, counts per outcome and each
test's outcome with the first line of why it failed or was skipped. Without a GPU every test is
skipped (their marker says so); the run proves the plumbing only. Exit code: pytest's, or 2 when
the arguments are bad.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

OUTCOMES = ("failure", "error", "skipped")  # a junit testcase's child elements; none means it passed


def parse_junit(path: str) -> list[dict]:
    """Each test case of a junit XML file: its id, outcome and the first line of why."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test = {"test": f"{case.get('classname')}::{case.get('name')}", "outcome": "passed",
                "time_s": float(case.get("time") or 0)}
        for child in case:
            if child.tag in OUTCOMES:
                test["outcome"] = {"failure": "failed"}.get(child.tag, child.tag)
                test["why"] = ((child.get("message") or child.text or "").strip().splitlines() or [""])[0][:300]
                break
        tests.append(test)
    return tests


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_pytest.json")
    ap.add_argument("--timeout-s", type=float, default=90.0, help="stop pytest after this many seconds")
    ap.add_argument("pytest_args", nargs="*", help="paths or options for pytest (default: tests/)")
    args = ap.parse_args(argv)
    if args.timeout_s <= 0:
        ap.error("--timeout-s must be positive")
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", f"--junitxml={xml}",
               *(args.pytest_args or ["tests/"])]
        try:
            done = subprocess.run(cmd, timeout=args.timeout_s, check=False, capture_output=True, text=True)
            rc, tail = done.returncode, done.stdout[-3000:]
        except subprocess.TimeoutExpired as exc:
            rc, tail = None, f"pytest stopped at the {args.timeout_s:.0f} s timeout\n" + (
                exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or "")[-3000:]
        tests = parse_junit(xml) if os.path.exists(xml) else []
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    result = {"command": " ".join(cmd[1:]), "device": gpu_name(), "exit_code": rc, "counts": counts,
              "wall_s": round(time.time() - started, 2), "tests": tests, "output_tail": tail}
    with open(os.path.join(args.out, "gpu_pytest.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("device", "exit_code", "counts", "wall_s")}))
    return 1 if rc is None else rc


if __name__ == "__main__":
    sys.exit(main())

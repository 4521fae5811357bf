"""The pool allocator on a real GPU (skipped without CUDA): each case runs in a fresh process, since
the allocator must replace PyTorch's before the process's first CUDA allocation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def memplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memplan", *args], capture_output=True, text=True, timeout=600)


def test_a_smartpool_plan_trains_on_its_layout_bit_identically():
    proc = memplan("run", "transformer-encoder", "--batch", "8", "--planner", "smartpool", "--device", "cuda",
                   "--steps", "2", "--timed-steps", "2", "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    pool = out["pool"]
    assert out["allocator"] == "pool" and pool["pool_bytes"] > 0
    last = pool["steps"][-1]
    assert last["served"] > 0.9 * pool["slots"]  # nearly every planned request lands at its slot
    assert last["conflicts"] == 0 and last["other_stream"] == 0
    assert out["max_param_diff"] == 0.0 and out["executor"]["diverged_steps"] == 0
    assert all(s["measured_peak_reserved_bytes"] >= pool["pool_bytes"] for s in out["steps"])


def test_the_pool_cannot_replace_an_allocator_in_use():
    code = ("import torch; torch.ones(1, device='cuda')\n"
            "from memplan.pool.replay_allocator import install_cuda_allocator\n"
            "try:\n    install_cuda_allocator()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "MemplanError" in proc.stdout and "before the first CUDA allocation" in proc.stdout

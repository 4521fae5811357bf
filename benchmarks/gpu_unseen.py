"""What a dispatch-level trace does not see on a GPU, measured op by op (and on the CPU as a dry run).

For each model, in a fresh process: plain step time; the same step under a pass-through
dispatch mode (what any per-op Python costs); the real step's op names beside a fake trace's
on the same device (where they differ); and, op by op, the allocator's peak during the op
against what the op's new outputs account for (library workspaces, kernels' internal buffers,
rounding). Writes JSON lines to OUT/gpu_unseen.jsonl and prints a summary.

    python benchmarks/gpu_unseen.py --out DIR [--deadline-s 150] [--models resnet50:64,hf:gpt2:8]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter

DEFAULT_MODELS = "resnet50:64,hf:gpt2:8,transformer-encoder:32"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=150)
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        probe(args.one, args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    end = time.time() + args.deadline_s
    for spec in args.models.split(","):
        left = end - time.time()
        if left < 15:
            print(json.dumps({"model": spec, "skipped": "deadline"}), flush=True)
            continue
        try:
            subprocess.run([sys.executable, __file__, "--out", args.out, "--one", spec], timeout=left, check=False)
        except subprocess.TimeoutExpired:
            print(json.dumps({"model": spec, "error": "timeout"}), flush=True)


def split_spec(spec: str) -> tuple[str, int]:
    name, batch = spec.rsplit(":", 1)
    return name, int(batch)


def probe(spec: str, out: str) -> None:
    import torch

    name, batch = split_spec(spec)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    rec = {"model": name, "batch": batch, "device": device, "torch": torch.__version__}
    if cuda:
        rec["gpu"] = torch.cuda.get_device_name(0)
        rec["tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32,
                       "precision": torch.get_float32_matmul_precision()}
    emit = lambda r: _emit(out, r)  # noqa: E731
    from memplan import trace_workload
    from memplan import get_workload

    w = get_workload(name, batch, device=device, seed=0)
    for _ in range(2):
        w.step(*w.inputs)
    _sync(cuda)
    rec["allocated_after_warmup"] = torch.cuda.memory_allocated() if cuda else None
    rec["state_bytes"] = _state_bytes(w)
    rec["plain_step_s"] = _median_step(w, cuda)
    rec["passthrough_mode_step_s"] = _median_step(w, cuda, mode=_Passthrough)
    names, unseen = _real_ops(w, cuda)
    rec["real_ops"] = len(names)
    t0 = time.time()
    try:
        tr = trace_workload(name, batch, fake=True, device=device)
        fake_names = [op.name for op in tr.ops]
        rec.update(fake_ops=len(fake_names), fake_trace_s=time.time() - t0, trace_peak_bytes=tr.peak_load_bytes,
                   op_diff=_diff(fake_names, names))
        rec.update(_under_none(w, tr, cuda))
    except Exception as exc:  # noqa: BLE001 - a diagnostic: report and go on
        rec["fake_error"] = repr(exc)[:400]
    if cuda:
        rec.update(step_peak_allocated=unseen.pop("step_peak"), step_peak_reserved=torch.cuda.max_memory_reserved())
    rec["unseen"] = unseen
    emit(rec)


class _Passthrough:
    """A dispatch mode that only calls the op: the floor of any per-op Python."""

    def __new__(cls):
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        return Mode()


def _under_none(w, tr, cuda: bool) -> dict:
    """The executor with nothing to do, on the fake trace: its step time and whether it kept in sync."""
    from memplan import optimize

    step = optimize(w.step, *w.inputs, trace=tr, planner="none", model=w.model, optimizer=w.optimizer,
                    measure=False)
    times = []
    for i in range(6):
        x = w.make_inputs(w.batch, seed=200 + i)
        _sync(cuda)
        t = time.perf_counter()
        step(*x)
        _sync(cuda)
        times.append(time.perf_counter() - t)
    stats = step.stats()
    step.close()
    return {"memplan_none_step_s": statistics.median(times[1:]), "none_diverged_steps": stats["diverged_steps"]}


def _median_step(w, cuda: bool, mode=None, steps: int = 6) -> float:
    import contextlib

    times = []
    for i in range(steps):
        x = w.make_inputs(w.batch, seed=100 + i)
        _sync(cuda)
        t = time.perf_counter()
        with mode() if mode else contextlib.nullcontext():
            w.step(*x)
        _sync(cuda)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def _real_ops(w, cuda: bool):
    """Op names of one real step, and per op the allocator's peak beyond what its new outputs hold."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from memplan.tracing.opinfo import counts_as_op, split_tensors

    names, rows = [], []

    class Meter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            out = func(*args, **kwargs)
            if not counts_as_op(func, args, kwargs, out):
                return out
            names.append(str(func))
            if cuda:
                peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
                fresh = sum(_rounded(t.untyped_storage().nbytes()) for t in split_tensors(func, args, kwargs, out).fresh)
                rows.append((str(func), peak - before - fresh, after - before - fresh, fresh))
            return out

    x = w.make_inputs(w.batch, seed=7)
    _sync(cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with Meter():
        w.step(*x)
    _sync(cuda)
    if not cuda:
        return names, {}
    step_peak = torch.cuda.max_memory_allocated()
    transient = sorted(rows, key=lambda r: -r[1])[:12]
    kept = sorted(rows, key=lambda r: -r[2])[:6]
    by_name = Counter()
    for n, extra, _, _ in rows:
        if extra > 0:
            by_name[n] = max(by_name[n], extra)
    return names, {"step_peak": step_peak, "top_transient": transient, "top_kept": kept,
                   "max_transient_by_op": by_name.most_common(12),
                   "ops_with_transient": sum(r[1] > 0 for r in rows)}


def _rounded(n: int) -> int:
    return 512 if n <= 512 else (n + 511) // 512 * 512


def _diff(a: list[str], b: list[str]) -> dict:
    """How the fake trace's op names (a) differ from the real step's (b)."""
    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    missing, inserted, first = Counter(), Counter(), []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        missing.update(a[i1:i2])
        inserted.update(b[j1:j2])
        if len(first) < 8:
            first.append([tag, i1, a[i1:i2][:3], j1, b[j1:j2][:3]])
    return {"only_in_fake": missing.most_common(10), "only_in_real": inserted.most_common(10), "first": first}


def _state_bytes(w) -> int:
    ts = list(w.model.parameters()) + list(w.model.buffers())
    ts += [p.grad for p in w.model.parameters() if p.grad is not None]
    ts += [v for s in w.optimizer.state.values() for v in s.values() if hasattr(v, "untyped_storage")]
    return sum(t.untyped_storage().nbytes() for t in {id(t): t for t in ts}.values())


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def _emit(out: str, rec: dict) -> None:
    with open(os.path.join(out, "gpu_unseen.jsonl"), "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    print(json.dumps(rec, default=str)[:3000], flush=True)


if __name__ == "__main__":
    main()

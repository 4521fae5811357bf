"""mu-cuDNN (paper 003) in memplan: the family time model against DeepBench, paper 003's
Fig. 9 and Fig. 13 shapes, the optimisers' speed, and micro-batching measured on this CPU.

    .venv/bin/python benchmarks/ucudnn.py [--only fit,fig9,fig13,speed,cpu] [--deepbench DIR]

Writes benchmarks/results/ucudnn_*.{md,json,png}; every table says where its numbers come from:
  fit    DeepBench (measured on V100, P100, GTX 1080 Ti) against today's roofline and the family
         time model fitted on two thirds of DeepBench's layers; errors on the held-out third, per
         GPU and kernel. Also writes the fitted coefficients the `model` source uses
         (memplan/conv/coefficients.json).
  fig9   Fig. 9 shape: AlexNet conv2 (Caffe's geometry, batch 256) forward on the V100 `model`
         source, per batch-size policy under 8, 64 and 512 MiB of workspace. Modelled, not measured.
  fig13  Fig. 13 shape: WR against WD at equal total workspace for AlexNet (batch 256) and
         ResNet-50 (batch 64), V100 `model` source: summed convolution time. Modelled.
  speed  WR's DP for one kernel at batch 256 with `all`, and WD's ILP for ResNet-50, on this CPU.
  cpu    Measured here: does splitting into micro-batches speed up any convolution kernel of
         ResNet-50 or VGG16 at batch 64 with PyTorch's CPU convolution (`cpu` source)?
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from memplan import get_profile
from memplan.services import conv_policy_sizes, read_conv_csv
from memplan.conv import fit as F
from memplan.conv.kernels import Kernel
from memplan.conv.options import POLICIES, Option, accumulator_bytes
from memplan.conv.sources import ModelSource
from memplan.conv.timemodel import write_coefficients
from memplan.conv.wr import best_config
from memplan.fileio import atomic_write_text
from memplan.model import CONV_KERNELS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEEPBENCH = ROOT / "data" / "deepbench"  # vendored, see its SOURCE.md
COEFFICIENTS = ROOT / "memplan" / "conv" / "coefficients.json"
HELD_OUT = 1 / 3  # share of DeepBench's layers kept out of the fit
SPLIT_SEED = 0  # the committed model's split
CV_SEEDS = range(1, 6)  # further random splits, to show how much the held-out error depends on the split
MIB = 2**20

log = logging.getLogger("ucudnn-bench")


# --- fit: the family time model against DeepBench --------------------------------------------------


def run_fit(deepbench: Path) -> dict:
    """Fit per GPU on the training layers, write the coefficients, score both models on the held-out ones."""
    data = read_conv_csv(deepbench / "conv_train_fp32.csv")
    shapes = F.layer_shapes(*data.values())
    models, rows = {}, []
    for gpu, samples in data.items():  # DeepBench's GPUs, named as their profiles
        profile = get_profile(gpu)
        train, test = F.split_by_shape(samples, HELD_OUT, SPLIT_SEED, shapes)
        models[gpu] = F.fit(train, profile)
        rows += _scores(gpu, profile, models[gpu], test)
        rows.append({**_scores(gpu, profile, models[gpu], test, by_kind=False)[0],
                     "cv_geomean": _cross_validated(samples, profile, shapes)})
    write_coefficients(models, f"fitted by benchmarks/ucudnn.py on DeepBench's conv_train_fp32.csv, "
                               f"{1 - HELD_OUT:.0%} of the layers (split seed {SPLIT_SEED})", COEFFICIENTS)
    return {"source": "DeepBench (measured) vs roofline and family model (predicted)", "held_out_share": HELD_OUT,
            "rows": rows}


def _scores(gpu, profile, model, test, by_kind=True) -> list[dict]:
    groups = [(kind, [s for s in test if s[0].kind == kind]) for kind in CONV_KERNELS] if by_kind else [("all", test)]
    out = []
    for kind, samples in groups:
        kernels, measured = [k for k, _ in samples], np.array([t for _, t in samples])
        out.append({"gpu": gpu, "kernel": kind, "rows": len(samples),
                    "roofline": F.errors(F.roofline(kernels, profile), measured),
                    "model": F.errors(F.predict(model, kernels), measured)})
    return out


def _cross_validated(samples, profile, shapes) -> list[float]:
    """Held-out geometric-mean error of fits on other random splits."""
    out = []
    for seed in CV_SEEDS:
        train, test = F.split_by_shape(samples, HELD_OUT, seed, shapes)
        model = F.fit(train, profile)
        out.append(round(F.errors(F.predict(model, [k for k, _ in test]), np.array([t for _, t in test]))["geomean"], 3))
    return out


def fit_markdown(result: dict) -> str:
    lines = ["| GPU | kernel | held-out rows | roofline median | roofline p90 | roofline geomean | "
             "model median | model p90 | model geomean |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [f"{r[m][q]:.0%}" for m in ("roofline", "model") for q in ("median", "p90", "geomean")]
        lines.append(f"| {r['gpu']} | {r['kernel']} | {r['rows']} | " + " | ".join(cells) + " |")
    cv = [f"{r['gpu']}: {', '.join(f'{g:.0%}' for g in r['cv_geomean'])}" for r in result["rows"] if "cv_geomean" in r]
    lines += ["", "Model geomean error on the held-out layers of five other random splits: " + "; ".join(cv) + "."]
    return "\n".join(lines) + "\n"


# --- fig9: AlexNet conv2 per policy and workspace limit (model source) -----------------------------

# Caffe's AlexNet conv2 as paper 003 benchmarks it: 96 -> 256 channels, 5x5, pad 2, on 27x27, batch 256
# (ungrouped; Caffe's reference net splits it into two groups of 48 -> 128).
CONV2 = Kernel(kind="fwd", n=256, c=96, h=27, w=27, k=256, r=5, s=5, pad_h=2, pad_w=2)
FIG9_LIMITS = (8 * MIB, 64 * MIB, 512 * MIB)
FIG9_PROFILE = "v100"


def run_fig9() -> dict:
    """Per kernel kind, policy and limit: WR's configuration and time (V100 model source)."""
    source = ModelSource(get_profile(FIG9_PROFILE))
    rows = []
    for kind in CONV_KERNELS:
        kernel = replace(CONV2, kind=kind)
        for policy in POLICIES:
            sizes = conv_policy_sizes(policy, kernel.n)
            by_size = _options(source, kernel, sizes)
            for limit in FIG9_LIMITS:
                acc = accumulator_bytes(kind, kernel.weight_bytes, kernel.element_bytes)
                c = best_config(by_size, kernel.n, limit, acc)
                rows.append({"kernel": kind, "policy": policy, "limit_mib": limit // MIB, "time_ms": c.time_s * 1e3,
                             "workspace_mib": c.workspace_bytes / MIB, "config": _describe(c)})
    for r in rows:
        base = next(b for b in rows if (b["kernel"], b["policy"], b["limit_mib"]) == (r["kernel"], "undivided",
                                                                                      r["limit_mib"]))
        r["speedup_vs_undivided"] = base["time_ms"] / r["time_ms"]
    _fig9_plot(rows)
    return {"source": f"model:{FIG9_PROFILE} (fitted family model; predicted, not measured)",
            "kernel": CONV2.describe(), "rows": rows}


def _options(source, kernel: Kernel, sizes: list[int]) -> dict[int, list[Option]]:
    rows = source.measure([kernel.with_batch(b) for b in sizes])
    out: dict[int, list[Option]] = {b: [] for b in sizes}
    for r in rows:
        out[r.kernel.n].append(Option(time_s=r.time_s, workspace_bytes=r.workspace_bytes or 0, algo=r.algo))
    return out


def _describe(c) -> str:
    """`3 x 64 winograd + 1 x 64 gemm`: runs of equal micro-batches."""
    parts, last, count = [], None, 0
    for item in list(zip(c.sizes, c.algos)) + [None]:
        if item == last:
            count += 1
            continue
        if last is not None:
            parts.append(f"{count} x {last[0]} {last[1]}")
        last, count = item, 1
    return " + ".join(parts)


def _fig9_plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CONV_KERNELS), figsize=(12, 3.6), sharey=False)
    width = 0.27
    for ax, kind in zip(axes, CONV_KERNELS):
        for j, policy in enumerate(POLICIES):
            mine = [r for r in rows if r["kernel"] == kind and r["policy"] == policy]
            ax.bar(np.arange(len(mine)) + (j - 1) * width, [r["time_ms"] for r in mine], width, label=policy)
        ax.set_xticks(range(len(FIG9_LIMITS)), [f"{m // MIB} MiB" for m in FIG9_LIMITS])
        ax.set_title(f"AlexNet conv2 {kind}, batch 256")
        ax.set_ylabel("ms (V100 model, predicted)")
    axes[0].legend(title="policy")
    fig.tight_layout()
    fig.savefig(RESULTS / "ucudnn_fig9.png", dpi=110)
    plt.close(fig)


def fig9_markdown(result: dict) -> str:
    lines = [f"Source: {result['source']}. Kernel: {result['kernel']} (and its two backward kernels).", "",
             "| kernel | policy | limit | time (ms) | vs undivided | workspace (MiB) | configuration |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['kernel']} | {r['policy']} | {r['limit_mib']} MiB | {r['time_ms']:.3f} | "
                     f"{r['speedup_vs_undivided']:.2f}x | {r['workspace_mib']:.1f} | {r['config']} |")
    return "\n".join(lines) + "\n"


# --- fig13: WR against WD at equal total workspace (model source) ----------------------------------

FIG13_MODELS = (("alexnet", 256), ("resnet50", 64))
FIG13_LIMITS = (8 * MIB, 64 * MIB)  # WR's per-kernel limit; WD gets (number of kernels) x this in total
FIG13_POLICY = "powerOfTwo"


def run_fig13() -> dict:
    """Summed convolution time under WR (per-kernel limit) and WD (the same total), and WD at half."""
    from memplan import trace_workload
    from memplan.conv.decide import decide

    profile = get_profile(FIG9_PROFILE)
    rows = []
    for model, batch in FIG13_MODELS:
        trace = trace_workload(model, batch, fake=True)
        n_kernels = sum(len(op.conv.kernels) for op in trace.ops if op.conv is not None)
        for limit in FIG13_LIMITS:
            entry = {"model": model, "batch": batch, "kernels": n_kernels, "wr_limit_mib": limit // MIB}
            for name, mode, policy, total in (("undivided", "wr", "undivided", limit),
                                              ("wr", "wr", FIG13_POLICY, limit),
                                              ("wd", "wd", FIG13_POLICY, limit * n_kernels),
                                              ("wd_half", "wd", FIG13_POLICY, limit * n_kernels // 2)):
                started = time.perf_counter()
                mbs = decide(trace, profile, mode=mode, workspace=total, policy=policy)
                entry[name] = _summed(mbs, started)
            # WD within what WR actually used in total (stricter than its limit)
            used = round(entry["wr"]["workspace_sum_mib"] * MIB)
            started = time.perf_counter()
            entry["wd_used"] = _summed(decide(trace, profile, mode="wd", workspace=used, policy=FIG13_POLICY), started)
            rows.append(entry)
    return {"source": f"model:{FIG9_PROFILE} (fitted family model; predicted, not measured)", "policy": FIG13_POLICY,
            "rows": rows}


def _summed(mbs, started: float) -> dict:
    return {"time_ms": sum(m.time_s for m in mbs) * 1e3,
            "workspace_sum_mib": sum(m.workspace_bytes + m.accumulator_bytes for m in mbs) / MIB,
            "workspace_max_mib": max(m.workspace_bytes for m in mbs) / MIB,
            "split_kernels": sum(len(m.sizes) > 1 for m in mbs), "seconds": round(time.perf_counter() - started, 2)}


def fig13_markdown(result: dict) -> str:
    lines = [f"Source: {result['source']}. Policy {result['policy']}. Time: sum over every convolution kernel of "
             "one iteration. WR: each kernel within the per-kernel limit; WD: the kernels' workspaces summed "
             "within (kernels x limit), within half of that, and within the total WR actually used (ws: workspace "
             "plus split weight-gradient accumulators, summed over kernels).", "",
             "| model | batch | kernels | per-kernel limit | undivided (ms) | WR (ms) | WD same total (ms) | "
             "WD half total (ms) | WR ws sum (MiB) | WD ws sum (MiB) | WD half ws sum (MiB) | WD vs WR | "
             "WD half vs WR | WD within WR's used ws (ms) | vs WR |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        u, wr, wd_, half, used = r["undivided"], r["wr"], r["wd"], r["wd_half"], r["wd_used"]
        lines.append(f"| {r['model']} | {r['batch']} | {r['kernels']} | {r['wr_limit_mib']} MiB | {u['time_ms']:.2f} | "
                     f"{wr['time_ms']:.2f} | {wd_['time_ms']:.2f} | {half['time_ms']:.2f} | "
                     f"{wr['workspace_sum_mib']:.0f} | {wd_['workspace_sum_mib']:.0f} | "
                     f"{half['workspace_sum_mib']:.0f} | {wr['time_ms'] / wd_['time_ms']:.3f}x | "
                     f"{wr['time_ms'] / half['time_ms']:.3f}x | {used['time_ms']:.2f} | "
                     f"{wr['time_ms'] / used['time_ms']:.3f}x |")
    return "\n".join(lines) + "\n"


# --- speed: the optimisers on this CPU --------------------------------------------------------------


def run_speed() -> dict:
    """WR's DP on AlexNet conv2 at batch 256 with `all`; WD's fronts and ILP for ResNet-50 at batch 64."""
    from memplan import trace_workload
    from memplan.services import trace_conv_kernels
    from memplan.conv import wd

    source = ModelSource(get_profile(FIG9_PROFILE))
    options = _options(source, CONV2, conv_policy_sizes("all", CONV2.n))
    first = _timed(lambda: best_config(options, CONV2.n, 64 * MIB))  # includes numba's compile, if any
    dp = min(_timed(lambda: best_config(options, CONV2.n, 64 * MIB)) for _ in range(5))
    trace = trace_workload("resnet50", 64, fake=True)
    kernels = trace_conv_kernels(trace)
    opts = {tk.kernel: _options(source, tk.kernel, conv_policy_sizes(FIG13_POLICY, tk.kernel.n)) for tk in kernels}
    started = time.perf_counter()
    fronts = [wd.pareto_front(opts[tk.kernel], tk.kernel.n) for tk in kernels]
    fronts_s = time.perf_counter() - started
    limit = 64 * MIB * len(kernels) // 2
    ilp = min(_timed(lambda: wd.solve(fronts, limit)) for _ in range(3))
    return {"host": "this CPU (shared with other jobs)", "wr_dp_all_batch256_s": dp, "wr_dp_first_call_s": first,
            "wr_sizes": CONV2.n, "resnet50_kernels": len(kernels), "front_points": sum(map(len, fronts)),
            "wd_fronts_s": fronts_s, "wd_ilp_s": ilp, "wd_total_s": fronts_s + ilp}


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def speed_markdown(r: dict) -> str:
    return (f"Measured on {r['host']}.\n\n| what | seconds | target |\n|---|---|---|\n"
            f"| WR DP, one kernel, batch {r['wr_sizes']}, policy all (best of 5) | {r['wr_dp_all_batch256_s']:.4f} "
            f"| < 0.1 |\n| the same, first call (numba compile included) | {r['wr_dp_first_call_s']:.2f} | |\n"
            f"| WD Pareto fronts, ResNet-50 batch 64 ({r['resnet50_kernels']} kernels, {r['front_points']} "
            f"points) | {r['wd_fronts_s']:.3f} | |\n| WD ILP (HiGHS), best of 3 | {r['wd_ilp_s']:.3f} | |\n"
            f"| WD fronts + ILP | {r['wd_total_s']:.3f} | < 5 |\n")


# --- cpu: does micro-batching speed up a convolution here? (measured) -------------------------------

CPU_MODELS = (("resnet50", 64), ("vgg16", 64))
CPU_BUDGET_S = float(os.environ.get("UCUDNN_CPU_BUDGET_S", "900"))  # per model: the host is shared
CPU_SIZES = (64, 32, 16, 8)  # undivided, then 2, 4 and 8 equal micro-batches
CONFIRM_OVER = 1.10  # a split that looks this much faster is measured again, head to head


def run_cpu() -> dict:
    """Per distinct kernel (in op order, until the per-model budget is spent): PyTorch's CPU time
    at each micro-batch size, and the best split against the undivided kernel."""
    from memplan import trace_workload
    from memplan.services import trace_conv_kernels
    from memplan.conv.sources import CpuSource, time_kernel

    source = CpuSource(repeats=2)
    models = []
    for model, batch in CPU_MODELS:
        trace = trace_workload(model, batch, fake=True)
        kernels = list(dict.fromkeys(tk.kernel for tk in trace_conv_kernels(trace)))
        started, rows = time.perf_counter(), []
        for kernel in kernels:
            if time.perf_counter() - started > CPU_BUDGET_S:
                break
            times = {b: time_kernel(kernel.with_batch(b), source.repeats) for b in CPU_SIZES}
            whole = times[batch]
            best_b = min(CPU_SIZES, key=lambda b: times[b] * batch / b)
            split = times[best_b] * batch / best_b
            row = {"kernel": kernel.describe(), "undivided_ms": whole * 1e3,
                   "per_size_ms": {b: t * 1e3 for b, t in times.items()}, "best_micro_batch": best_b,
                   "best_ms": split * 1e3, "speedup": whole / split}
            if row["speedup"] > CONFIRM_OVER:  # measured again, alternating, to rule out a noisy first try
                again_whole = time_kernel(kernel, 3)
                again_split = time_kernel(kernel.with_batch(best_b), 3) * batch / best_b
                row["confirmed_speedup"] = again_whole / again_split
            rows.append(row)
            log.info("%s %s: %.1f ms, best %d x %d: %.2fx", model, kernel.describe(), whole * 1e3, batch // best_b,
                     best_b, row["speedup"])
        models.append({"model": model, "batch": batch, "distinct_kernels": len(kernels), "measured": len(rows),
                       "seconds": round(time.perf_counter() - started, 1), "rows": rows})
    return {"source": source.name + ", measured here (best of 2 runs after a warm-up; host shared with other jobs)",
            "sizes": CPU_SIZES, "models": models}


def cpu_markdown(result: dict) -> str:
    lines = [f"Source: {result['source']}. Micro-batch sizes tried: {', '.join(map(str, result['sizes']))} "
             "(equal splits). A split that looked more than 10% faster was measured again head to head "
             "(best of 3 each).", ""]
    for m in result["models"]:
        rows = m["rows"]
        faster = [r for r in rows if r.get("confirmed_speedup", 0) > CONFIRM_OVER]
        whole = sum(r["undivided_ms"] for r in rows)
        # a split counts only where the second, head-to-head measurement also found it faster
        best = sum(r["undivided_ms"] / (r["confirmed_speedup"] if r in faster else 1.0) for r in rows)
        kinds = sorted({r["kernel"].split()[0] for r in rows})
        lines += [f"**{m['model']} batch {m['batch']}**: {m['measured']} of {m['distinct_kernels']} distinct kernels "
                  f"(in op order, so {', '.join(kinds)} only) measured in {m['seconds']:.0f} s; splitting looked "
                  f"faster by >10% in {sum(r['speedup'] > CONFIRM_OVER for r in rows)}, confirmed in {len(faster)}; "
                  f"summed over the measured kernels, splitting only the confirmed ones: undivided {whole:.0f} ms, "
                  f"split {best:.0f} ms ({whole / best if best else 1:.3f}x).", "",
                  "| kernel | undivided (ms) | best micro-batch | best (ms) | speedup | confirmed |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            conf = f"{r['confirmed_speedup']:.2f}x" if "confirmed_speedup" in r else ""
            lines.append(f"| {r['kernel']} | {r['undivided_ms']:.1f} | {r['best_micro_batch']} | {r['best_ms']:.1f} | "
                         f"{r['speedup']:.2f}x | {conf} |")
        lines.append("")
    return "\n".join(lines)


# --- exec: a real CPU run under a plan with micro-batched convolutions (measured) -------------------

EXEC_BATCH, EXEC_STEPS = 64, 3


def _exec_net():
    import torch

    class Net(torch.nn.Module):
        """ResNet-50-like 1x1 and 3x3 convolutions on 28x28 (the kernels whose CPU splits looked faster)."""

        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 256, 1), torch.nn.ReLU(),
                torch.nn.Conv2d(256, 64, 1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU())
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.body(x).mean(dim=(2, 3)))

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    return net, opt, step


def run_exec() -> dict:
    """Plan `ucudnn:wr` on the `cpu` source (measured here), train EXEC_STEPS steps under it and
    without a plan from the same weights and data; compare the weights and the step times."""
    import torch

    from memplan import optimize

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(EXEC_BATCH, 3, 28, 28, generator=g), torch.randint(0, 10, (EXEC_BATCH,), generator=g))
            for _ in range(EXEC_STEPS)]
    net, opt, step = _exec_net()
    planned = optimize(step, *data[0], model=net, optimizer=opt, planner="ucudnn:wr", profile=FIG9_PROFILE, source="cpu",
                       policy="powerOfTwo")
    splits = [{"op": m.op, "kernel": m.kernel, "module": m.module, "sizes": list(m.sizes), "time_ms": m.time_s * 1e3}
              for m in planned.plan.microbatches if len(m.sizes) > 1]
    times = {}
    ref_net, _, ref_step = _exec_net()
    bare_net, bare_opt, bare_step = _exec_net()  # the executor without a plan: its own overhead
    bare = optimize(bare_step, *data[0], model=bare_net, optimizer=bare_opt, planner="none", profile=FIG9_PROFILE)
    for name, fn in (("planned", planned), ("plain", ref_step), ("executor_no_plan", bare)):
        times[name] = []
        for x, y in data:
            started = time.perf_counter()
            fn(x, y)
            times[name].append(time.perf_counter() - started)
    stats = planned.stats()
    planned.close()
    bare.close()
    diff = max(float((a - b).abs().max()) for a, b in zip(net.state_dict().values(), ref_net.state_dict().values()))
    return {"source": "measured on this CPU (plan: cpu source; run: real tensors, memplan's executor vs plain PyTorch)",
            "batch": EXEC_BATCH, "steps": EXEC_STEPS, "split_kernels": splits,
            "kernels": len(planned.plan.microbatches), "max_param_diff": diff,
            "diverged_steps": stats["diverged_steps"], "step_s": times}


def _runs(sizes) -> str:
    """`32 x 2` for runs of equal micro-batches."""
    out, i = [], 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        out.append(f"{j - i} x {sizes[i]}")
        i = j
    return " + ".join(out)


def exec_markdown(r: dict) -> str:
    lines = [f"Source: {r['source']}. Batch {r['batch']}, {r['steps']} SGD steps from the same weights and data.", "",
             f"- kernels planned: {r['kernels']}; split into micro-batches: {len(r['split_kernels'])}",
             f"- largest difference of any weight after {r['steps']} steps, planned vs plain: {r['max_param_diff']:.3g}",
             f"- diverged steps: {r['diverged_steps']}",
             f"- step seconds, planned (memplan executor): {', '.join(f'{t:.2f}' for t in r['step_s']['planned'])}; "
             f"plain PyTorch: {', '.join(f'{t:.2f}' for t in r['step_s']['plain'])}; memplan's executor without a "
             f"plan: {', '.join(f'{t:.2f}' for t in r['step_s']['executor_no_plan'])}", "",
             "| op | module | kernel | micro-batches | planned time (ms, cpu source) |", "|---|---|---|---|---|"]
    for s in r["split_kernels"]:
        lines.append(f"| {s['op']} | {s['module']} | {s['kernel']} | {_runs(s['sizes'])} | "
                     f"{s['time_ms']:.1f} |")
    return "\n".join(lines) + "\n"


# --- driver ----------------------------------------------------------------------------------------


SECTIONS = {"fit": (run_fit, fit_markdown), "fig9": (run_fig9, fig9_markdown), "fig13": (run_fig13, fig13_markdown),
            "speed": (run_speed, speed_markdown), "cpu": (run_cpu, cpu_markdown), "exec": (run_exec, exec_markdown)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--deepbench", type=Path, default=DEEPBENCH, help="folder with DeepBench's CSV files")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md files from the .json ones")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        run, markdown = SECTIONS[name]
        if args.markdown_only:
            result = json.loads((RESULTS / f"ucudnn_{name}.json").read_text())
            atomic_write_text(RESULTS / f"ucudnn_{name}.md", markdown(result))
            continue
        started = time.perf_counter()
        result = run(args.deepbench) if name == "fit" else run()
        result["seconds"] = round(time.perf_counter() - started, 1)
        atomic_write_text(RESULTS / f"ucudnn_{name}.json", json.dumps(result, indent=1, default=str) + "\n")
        atomic_write_text(RESULTS / f"ucudnn_{name}.md", markdown(result))
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

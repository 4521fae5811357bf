"""vDNN and vDNN++ (paper 001): the paper's tables in simulation, and host compression measured.

    .venv/bin/python benchmarks/vdnn.py [--profile gtx1080ti] [--skip-compression] [--quick]

Parts (each row says "simulated (<profile>)" or "measured (CPU)"):
- Table III: the constructed network (1x1 convs among 5x5 convs) at batch 256: base(m),
  vDNN conv(m), vDNN++ conv(m) iteration times.
- Fig. 9 shape: AlexNet(256) and VGG-16(64), every mode, vDNN against vDNN++, each time
  normalised by base(p) (no offload, performance-optimal algorithms), budget = the GPU's memory.
- Table IV: VGG-116(32) and VGG-191(32) (20 and 35 extra convolutions in each VGG-16 conv
  group), dyn, conv(p), all(p), aconv(p), vDNN against vDNN++ at the GPU's memory.
- Table V: AlexNet(256), VGG-16(64): aggregate peak (the simulated load) against the smallest
  pool (§IV-B search) of best-fit and high-end, prefetch-first and derivative-first.
- vDNN++ against `autoswap:bo` and `home` at equal budgets (vDNN++:dyn's simulated peak).
- Compression (§IV-C), measured (CPU): real training steps of small CNNs on this CPU, the
  density of every ReLU output per step, the compression ratio of each and the pinned bytes
  saved, and host ZVC throughput per thread count (benchmarks/hostzvc.py).

Writes benchmarks/results/vdnn.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from memplan import InfeasibleBudgetError, Problem, UNLIMITED, get_workload, plan, trace_workload
from memplan.services import Simulator, residency_pool_problem
from memplan.fileio import atomic_write_text
from memplan.planners.vdnn import mode_plan
from memplan.pool.poolsize import smallest_pool
from memplan.zoo import vgg
from memplan.zoo.registry import get_spec
from memplan.zoo.workload import build_workload

sys.path.insert(0, str(Path(__file__).parent))
import hostzvc  # noqa: E402  (the host-side compression it measures, beside it)

RESULTS = Path(__file__).parent / "results"
MIB = 2**20
MODES = ("all", "conv", "aconv")
ALGOS = ("m", "p")
COMMAND = "benchmarks/vdnn.py"


# --- networks -----------------------------------------------------------------------------------


class ConstructedNet(nn.Module):
    """Table III: CONV_1 3x3,64; CONV_2 [1x1,64; 5x5,64] x5; global max pool; CONV_3 1x1,3; FC 2."""

    def __init__(self, repeats: int = 5):
        super().__init__()
        body = [nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(repeats):
            body += [nn.Conv2d(64, 64, 1), nn.ReLU(inplace=True), nn.Conv2d(64, 64, 5, padding=2), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*body, nn.AdaptiveMaxPool2d(1), nn.Conv2d(64, 3, 1))
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def deep_vgg_features(extra: int) -> nn.Sequential:
    """VGG-16's conv stack with `extra` more 3x3 convolutions in each of its five groups."""
    layers, cin, group = [], 3, []
    for item in vgg.CONFIGS[16]:
        if item != vgg.POOL:
            group.append(item)
            continue
        for cout in group + [group[-1]] * extra:
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True)]
            cin = cout
        layers.append(nn.MaxPool2d(2, 2))
        group = []
    return nn.Sequential(*layers)


def _factory(name: str, build, **config):
    """A workload factory for `trace_workload` from VGG-16's ImageNet spec with another network."""
    spec = dataclasses.replace(get_spec("vgg16"), name=name, build=build)

    def factory(batch, **_):
        merged = {**spec.defaults, "lr": spec.lr, "optimizer": spec.optimizer, **config}
        return build_workload(spec, batch=batch, input_size=spec.input_size, device="cpu", seed=0, config=merged)

    factory.__name__ = name
    return factory


def network(name: str, batch: int):
    """The trace of a named network: zoo names, `constructed`, `vgg116`, `vgg191`."""
    if name == "constructed":
        return trace_workload(_factory(name, lambda config, size: ConstructedNet(), num_classes=2), batch)
    if name in ("vgg116", "vgg191"):
        extra = {"vgg116": 20, "vgg191": 35}[name]

        def build(config, size):
            model = vgg.VGG(16, config["num_classes"], False)
            model.features = deep_vgg_features(extra)
            return model
        return trace_workload(_factory(name, build), batch)
    return trace_workload(name, batch)


# --- simulated tables ------------------------------------------------------------------------------


def _time_ms(trace, cost, planner: str, budget, **params) -> float | None:
    try:
        result = plan(trace, budget, planner=planner, cost=cost, **params).predicted
    except InfeasibleBudgetError:
        return None
    return result["time_s"] * 1e3


def _base_ms(trace, cost, algo: str) -> float:
    return Simulator(trace, cost).run(mode_plan(trace, cost, "none", algo, sync=False)).time_s * 1e3


def table3(profile: str, batch: int) -> dict:
    trace = network("constructed", batch)
    cost = Problem.of(trace, profile=profile).cost
    return {"network": f"constructed({batch})", "base(m)": _base_ms(trace, cost, "m"),
            "vDNN conv(m)": _time_ms(trace, cost, "vdnn:conv", UNLIMITED, algo="m"),
            "vDNN++ conv(m)": _time_ms(trace, cost, "vdnn++:conv", UNLIMITED, algo="m"),
            "paper (1080Ti, measured)": {"base(m)": 2091, "vDNN conv(m)": 2491, "vDNN++ conv(m)": 2261}}


def mode_rows(name: str, batch: int, profile: str, modes) -> list[dict]:
    """Per mode: vDNN and vDNN++ iteration time at the GPU's memory (None: out of memory)."""
    trace = network(name, batch)
    cost = Problem.of(trace, profile=profile).cost
    budget = cost.profile.memory_bytes
    base = _base_ms(trace, cost, "p")
    rows = []
    for mode, algo in modes:
        params = {} if mode == "dyn" else {"algo": algo}
        label = "dyn" if mode == "dyn" else f"{mode}({algo})"
        ms = {fam: _time_ms(trace, cost, f"{fam}:{mode}", budget, **params) for fam in ("vdnn", "vdnn++")}
        rows.append({"network": f"{name}({batch})", "mode": label, "base(p)_ms": base, "vDNN_ms": ms["vdnn"],
                     "vDNN++_ms": ms["vdnn++"], "budget_bytes": budget})
    return rows


def table5(name: str, batch: int, profile: str) -> list[dict]:
    """Aggregate peak against the smallest pool of best-fit / high-end in both orders (vDNN++ plans)."""
    trace = network(name, batch)
    cost = Problem.of(trace, profile=profile).cost
    rows = []
    for mode, algo in [(m, a) for m in MODES for a in ALGOS]:
        p = plan(trace, UNLIMITED, planner=f"vdnn++:{mode}", cost=cost, algo=algo)
        problem = residency_pool_problem(trace, p, cost)
        # the pool holds the trace's buffers: a (p) mode's cuDNN workspaces are not among them
        row = {"network": f"{name}({batch})", "mode": f"{mode}({algo})",
               "aggregate_mib": problem.peak_load_bytes / MIB}
        for heuristic, high in (("best-fit", False), ("high-end", True)):
            for order in ("prefetch-first", "derivative-first"):
                row[f"{order} {heuristic}_mib"] = smallest_pool(problem, high_end=high, order=order).pool_bytes / MIB
        rows.append(row)
    return rows


def smallest_budget(trace, cost, planner: str, **params) -> int:
    """The smallest budget `planner` fits (what its infeasible-budget error names for 1 byte)."""
    try:
        plan(trace, 1, planner=planner, cost=cost, simulate_result=False, **params)
    except InfeasibleBudgetError as exc:
        return exc.min_feasible_bytes
    return 1


def against_search(name: str, batch: int, profile: str, planners) -> list[dict]:
    """vDNN++'s fixed modes against search planners at the same budget (each mode's smallest)."""
    trace = network(name, batch)
    cost = Problem.of(trace, profile=profile).cost
    rows = []
    base_m = _base_ms(trace, cost, "m") / (cost.baseline_compute_s * 1e3) - 1  # what (m) algorithms cost alone
    for mode in MODES:
        budget = smallest_budget(trace, cost, f"vdnn++:{mode}", algo="m")
        ours = plan(trace, budget, planner=f"vdnn++:{mode}", cost=cost, algo="m")
        row = {"network": f"{name}({batch})", "vdnn++ mode": f"{mode}(m)", "budget_mib": budget / MIB,
               "trace_peak_mib": trace.peak_load_bytes / MIB,
               "base(m)_overhead": base_m, "vdnn++_overhead": ours.predicted["overhead"]}
        for other, params in planners:
            try:
                row[other] = plan(trace, budget, planner=other, cost=cost, **params).predicted["overhead"]
            except InfeasibleBudgetError:
                row[other] = None
        rows.append(row)
    return rows


# --- compression, measured on this CPU ---------------------------------------------------------


def relu_densities(name: str, batch: int, steps: int, input_size: int | None) -> tuple[list[dict], list[np.ndarray]]:
    """Train `steps` real steps on the CPU; per step and ReLU, the density of its output.

    Returns the per-layer rows and the last step's ReLU outputs (for the compression runs).
    """
    w = get_workload(name, batch, input_size=input_size, seed=0)
    torch.manual_seed(0)  # dropout masks: the same densities on every run
    captured: dict[str, np.ndarray] = {}
    hooks = [m.register_forward_hook(lambda m, i, out, n=n: captured.__setitem__(n, out.detach().numpy().copy()))
             for n, m in w.model.named_modules() if isinstance(m, nn.ReLU)]
    per_layer: dict[str, list[float]] = {}
    for step in range(steps):
        captured.clear()
        w.step(*w.make_inputs(batch, seed=100 + step))
        for n, out in captured.items():
            per_layer.setdefault(n, []).append(hostzvc.density(out))
    for h in hooks:
        h.remove()
    rows = [{"network": f"{name}({batch})", "relu": n, "density_per_step": d} for n, d in per_layer.items()]
    return rows, list(captured.values())


def compression_figures(outputs: list[np.ndarray], thread_counts, repeats: int = 5) -> dict:
    """Compression ratio and pinned bytes saved over `outputs`, and throughput per thread count."""
    original = sum(a.nbytes for a in outputs)
    packed = sum(hostzvc.compress(a).nbytes for a in outputs)
    throughput = []
    for threads in thread_counts:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            best_c, best_d = float("inf"), float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                packs = [hostzvc.compress(a, threads, pool) for a in outputs]
                t1 = time.perf_counter()
                for c, a in zip(packs, outputs):
                    assert np.array_equal(hostzvc.decompress(c, threads, pool).view(np.uint32), a.view(np.uint32))
                t2 = time.perf_counter()
                best_c, best_d = min(best_c, t1 - t0), min(best_d, t2 - t1)
        throughput.append({"threads": threads, "compress_GBps": original / best_c / 1e9,
                           "decompress_GBps": original / best_d / 1e9})
    return {"original_bytes": original, "compressed_bytes": packed, "ratio": packed / original,
            "pinned_saved": 1 - packed / original, "throughput": throughput}


def compression(quick: bool) -> dict:
    threads = sorted({1, 2, min(4, os.cpu_count() or 1)})
    out = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "networks": []}
    for name, batch, size in (("alexnet", 8, 128), ("vgg16", 2, 64)):
        steps = 2 if quick else 8
        rows, outputs = relu_densities(name, batch, steps, size)
        figures = compression_figures(outputs, threads)
        out["networks"].append({"network": f"{name}({batch}, {size}x{size})", "steps": steps, "layers": rows,
                                **figures})
    return out


# --- report ---------------------------------------------------------------------------------------


def _ms(x) -> str:
    return "OOM" if x is None else f"{x:.0f}"


def to_markdown(r: dict) -> str:
    profile = r.get("profile", r.get("device"))  # "device" in results written before issue 38
    t3 = r["table3"]
    lines = [f"# vDNN / vDNN++ (paper 001)\n\nCommand: `{r['command']}`\n",
             f"## Table III: constructed network, simulated ({profile})\n",
             "| network | base(m) ms | vDNN conv(m) ms | vDNN++ conv(m) ms | paper (1080Ti, measured) |", "|---|---|---|---|---|",
             f"| {t3['network']} | {_ms(t3['base(m)'])} | {_ms(t3['vDNN conv(m)'])} | {_ms(t3['vDNN++ conv(m)'])} | "
             f"2091 / 2491 / 2261 |\n",
             f"## Fig. 9 shape and Table IV: iteration time per mode, simulated ({profile}, budget = its memory)\n",
             "| network | mode | base(p) ms | vDNN ms | vDNN++ ms | vDNN / base | vDNN++ / base |", "|---|---|---|---|---|---|---|"]
    for row in r["fig9"] + r["table4"]:
        ratio = [("" if row[k] is None else f"{row[k] / row['base(p)_ms']:.2f}") for k in ("vDNN_ms", "vDNN++_ms")]
        lines.append(f"| {row['network']} | {row['mode']} | {row['base(p)_ms']:.0f} | {_ms(row['vDNN_ms'])} | "
                     f"{_ms(row['vDNN++_ms'])} | {ratio[0]} | {ratio[1]} |")
    lines += ["", "Paper Table IV (1080Ti, measured, ms): VGG-116(32) vDNN/vDNN++ dyn 2717/2468, conv(p) 3055/3018, "
              "all(p) 3170/3129, aconv(p) 2717/2468; VGG-191(32) dyn 5139/5097, conv(p) 5139/5097, all(p) 5244/5209, "
              "aconv(p) out of memory.\n",
              f"## Table V: aggregate peak against the smallest pool (MiB), vDNN++ plans, simulated ({profile})\n",
              "Buffers of the trace only: a (p) mode's convolution workspaces are not laid out in the pool.\n"]
    keys = [k for k in r["table5"][0] if k.endswith("_mib") and k != "aggregate_mib"]
    lines += ["| network | mode | aggregate | " + " | ".join(k[:-4] for k in keys) + " |",
              "|---|---|---|" + "---|" * len(keys)]
    for row in r["table5"]:
        lines.append(f"| {row['network']} | {row['mode']} | {row['aggregate_mib']:.0f} | "
                     + " | ".join(f"{row[k]:.0f}" for k in keys) + " |")
    if r.get("search"):
        fixed = ("network", "vdnn++ mode", "budget_mib", "trace_peak_mib", "vdnn++_overhead", "base(m)_overhead")
        names = [k for k in r["search"][0] if k not in fixed]
        lines += ["", f"## vDNN++ against search planners at its smallest budget, overhead, simulated ({profile})\n",
                  "Overheads against the trace as the cost model prices it; the search planners keep the "
                  "trace's convolution times, vDNN++ (m) runs memory-optimal algorithms, which alone cost "
                  "the base(m) column.\n",
                  "| network | vDNN++ mode | budget MiB (peak without a plan) | base(m) | vDNN++ | "
                  + " | ".join(names) + " |", "|---|---|---|---|---|" + "---|" * len(names)]
        for row in r["search"]:
            others = " | ".join("infeasible" if row[n] is None else f"{row[n]:.1%}" for n in names)
            lines.append(f"| {row['network']} | {row['vdnn++ mode']} | {row['budget_mib']:.0f} "
                         f"({row['trace_peak_mib']:.0f}) | "
                         f"{row['base(m)_overhead']:.1%} | {row['vdnn++_overhead']:.1%} | {others} |")
    if r.get("compression"):
        c = r["compression"]
        lines += ["", f"## Compression (§IV-C), measured (CPU: {c['cpu_count']} cores)\n",
                  "ReLU outputs of the last of the training steps; ratio = compressed / original bytes.\n",
                  "| network | steps | ReLU layers | mean density (last step) | ratio | pinned bytes saved | "
                  "threads: compress / decompress GB/s |", "|---|---|---|---|---|---|---|"]
        for n in c["networks"]:
            dens = np.mean([layer["density_per_step"][-1] for layer in n["layers"]])
            tp = "; ".join(f"{t['threads']}: {t['compress_GBps']:.2f} / {t['decompress_GBps']:.2f}"
                           for t in n["throughput"])
            lines.append(f"| {n['network']} | {n['steps']} | {len(n['layers'])} | {dens:.2f} | {n['ratio']:.2f} | "
                         f"{n['pinned_saved']:.0%} | {tp} |")
        lines += ["", "Paper: 36% pinned memory saved on average for AlexNet, 67% for VGG-16 (all layers compressed).",
                  "", "Density per ReLU layer and step:", ""]
        for n in c["networks"]:
            for layer in n["layers"]:
                lines.append(f"- {n['network']} `{layer['relu']}`: "
                             + ", ".join(f"{d:.3f}" for d in layer["density_per_step"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="gtx1080ti", help="the cost model's device profile (default: the paper's GPU)")
    ap.add_argument("--skip-compression", action="store_true", help="only the simulated tables")
    ap.add_argument("--quick", action="store_true", help="smaller batches, fewer steps (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the compression threads are the measured ones
    q = args.quick
    every = [(m, a) for m in MODES for a in ALGOS] + [("dyn", "")]
    table4_modes = [("dyn", ""), ("conv", "p"), ("all", "p"), ("aconv", "p")]
    result = {"command": " ".join(["python", COMMAND] + sys.argv[1:]), "profile": args.profile,
              "table3": table3(args.profile, 16 if q else 256),
              "fig9": mode_rows("alexnet", 32 if q else 256, args.profile, every)
              + mode_rows("vgg16", 8 if q else 64, args.profile, every),
              "table4": [] if q else mode_rows("vgg116", 32, args.profile, table4_modes)
              + mode_rows("vgg191", 32, args.profile, table4_modes),
              "table5": table5("alexnet", 32 if q else 256, args.profile) + table5("vgg16", 8 if q else 64, args.profile),
              "search": against_search("vgg16", 8 if q else 64, args.profile,
                                       [("autoswap:bo", {"n_trials": 4 if q else 16}),
                                        ("autoswap:swdoa", {}), ("home:fast", {"time_limit_s": 2 if q else 10})]),
              "compression": None if args.skip_compression else compression(q)}
    RESULTS.mkdir(exist_ok=True)
    stem = "vdnn_quick" if q else "vdnn"
    atomic_write_text(RESULTS / f"{stem}.json", json.dumps(result, indent=1, default=float) + "\n")
    atomic_write_text(RESULTS / f"{stem}.md", to_markdown(result))
    print(to_markdown(result))


if __name__ == "__main__":
    main()

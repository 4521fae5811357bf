"""Keep, swap or recompute jointly (issue 12): HOME, Capuchin and SuperNeurons against the baselines.

Sections (all simulated on one device profile, default h100; traces with fake tensors):
  targets   resnet50 batch 256 at 1/3 and 1/2 of its peak and at sqrt-n's peak: every new planner
            (home with its defaults: 500 particles x 500 iterations), with planning times
  pareto    resnet50, vgg16, hf:gpt2, hf:bert-base at 90/70/50/40/30% of the peak: the best new
            planner against the best of sqrt-n, checkpoint-all, save-on-cpu and autoswap:bo
            (and milp's columns from benchmarks/results/milp.json where that file exists)
  evaluator one policy evaluation, in parts: decoding, plan preparation with the simulator's
            memos cold and warm, the kernel; and what resuming the kernel at the first changed
            decision could save at most
  home_defaults  home with its defaults at 1/2 of resnet50@256's peak only (when targets ran reduced)
  parallel  home's particles over 1 process, 2 processes and 2 threads (same search, same result)
  table2    HOME Table 2: the largest batch under an 11 GiB budget per planner on HOME's six
            CIFAR models, with the simulated throughput there

    .venv/bin/python benchmarks/joint.py [--only targets,home_defaults,pareto,evaluator,parallel,table2]
        [--profile h100] [--home-particles N] [--models M@B,...] [--budgets 0.9,...] [--fast-limit-s S]
        [--parallel-particles N] [--table2-models NAME,...] [--render]

The reduced-run options shrink a section and are recorded in its results ("reduced"); --render
rewrites the targets or pareto markdown from its JSON.

Writes benchmarks/results/joint_<section>.{json,md} (and .png). Planning times are wall-clock
seconds on this host with the load average and the CPU seconds (process and workers) next to them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import threading
import time
from pathlib import Path

import numpy as np
from torch import nn

import memplan.planners.home as home_module
from memplan import Cost, DEFAULT_PROFILE, InfeasibleBudgetError, Problem, UNLIMITED, plan, trace_workload
from memplan.services import Simulator
from memplan.fileio import atomic_write_text
from memplan.planners.home.pso import Chunk, random_policies
from memplan.planners.kit.featuremaps import feature_maps
from memplan.planners.kit.policy import PolicyEvaluator
from memplan.plots import new_figure, plot_history, save_figure
from memplan.workflows.maxbatch import search
from memplan.zoo.tasks import classify_loss, image_inputs
from memplan.zoo.workload import SGD_LR, ModelSpec, build_workload

RESULTS = Path(__file__).parent / "results"
GIB = 2**30
NEW = ("home", "home:fast", "capuchin", "superneurons")
BASELINES = ("sqrt-n", "checkpoint-all", "save-on-cpu", "autoswap:bo")
PARETO_MODELS = ("resnet50@256", "vgg16@64", "hf:gpt2@8", "hf:bert-base@8")
PARETO_BUDGETS = (0.9, 0.7, 0.5, 0.4, 0.3)
PARETO_HOME = {"time_limit_s": 60.0}  # home:fast in the sweep: the planning-time target as its limit
TABLE2_MEMORY = 11 * GIB  # the RTX 2080 Ti of HOME's Table 2
TABLE2_PLANNERS = ("none", "superneurons", "capuchin", "home:fast")
TABLE2_HOME = {"time_limit_s": 10.0, "particles": 100}  # ~20 batches probed per model
TABLE2_LIMIT = 16384  # largest batch probed
PARALLEL_PARTICLES = 100
# What a reduced run changed (set from the command line; empty: the full benchmark as the issue asks).
REDUCED: dict = {}
log = logging.getLogger("joint")


# --- traces and timed planning ---------------------------------------------------------------------


_TRACES: dict = {}


def traced(model, batch: int, **kw):
    """A fake-tensor trace, made once per (model, batch)."""
    key = (model if isinstance(model, str) else model.__name__, batch, tuple(sorted(kw.items())))
    if key not in _TRACES:
        _TRACES[key] = trace_workload(model, batch, fake=True, **kw)
    return _TRACES[key]


def cpu_seconds() -> float:
    """User+system CPU of this process and its finished children (the particle workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed_plan(trace, budget, name: str, cost: Cost, **params) -> dict:
    """Plan and simulate; the row records overhead, peak, planning wall and CPU seconds and the load."""
    load, cpu, started = os.getloadavg()[0], cpu_seconds(), time.perf_counter()
    try:
        p = plan(trace, budget, planner=name, cost=cost, seed=0, **params)
    except InfeasibleBudgetError as exc:
        return {"planner": name, "feasible": False, "min_feasible_bytes": exc.min_feasible_bytes}
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    pred = p.predicted
    row = {"planner": name, "feasible": bool(pred["feasible"]), "overhead": pred["overhead"],
           "time_s": pred["time_s"], "peak_bytes": pred["peak_load_bytes"], "planning_s": round(p.planning_s, 2), "wall_s": round(wall, 2),
           "cpu_s": round(cpu, 2), "load_avg": round(load, 2), "swaps": sum(d.action == "swap" for d in p.decisions),
           "recomputes": sum(d.action == "recompute" for d in p.decisions)}
    if p.history:
        row["history"] = p.history
    return row


def _pct(row: dict | None) -> str:
    if row and not row.get("feasible") and row.get("min_feasible_bytes"):
        return f"does not fit (from {row['min_feasible_bytes'] / GIB:.2f} GiB)"
    return "—" if not row or not row.get("feasible") else f"{row['overhead']:.1%}"


def _split(item: str) -> tuple[str, int]:
    model, _, batch = item.partition("@")
    return model, int(batch)


def _write(name: str, data: dict, markdown: str) -> None:
    atomic_write_text(RESULTS / f"joint_{name}.json", json.dumps(data, indent=1, default=float) + "\n")
    atomic_write_text(RESULTS / f"joint_{name}.md", markdown)
    print(markdown)


# --- targets -------------------------------------------------------------------------------------------


def targets(profile: str) -> None:
    """resnet50@256 at 1/3 and 1/2 of the peak and at sqrt-n's peak."""
    trace = traced("resnet50", 256)
    cost = Problem.of(trace, profile=profile).cost
    sqrt_n = timed_plan(trace, UNLIMITED, "sqrt-n", cost)
    cases = {"1/3 of the peak": trace.peak_load_bytes // 3, "1/2 of the peak": trace.peak_load_bytes // 2,
             "sqrt-n's peak": sqrt_n["peak_bytes"]}
    goals = {"1/3 of the peak": 0.10, "1/2 of the peak": 0.03, "sqrt-n's peak": sqrt_n["overhead"] / 3}
    rows = []
    for label, budget in cases.items():
        for name in NEW:
            row = timed_plan(trace, int(budget), name, cost, **(_home_targets() if name == "home" else {}))
            rows.append({"case": label, "budget_bytes": int(budget), "goal": goals[label], **row})
            log.info("%s %s: %s", label, name, {k: v for k, v in row.items() if k != "history"})
    home = next(r for r in rows if r["planner"] == "home" and r["case"] == "1/2 of the peak" and r.get("history"))
    plot_history(f"home on resnet50@256 at 1/2 of the peak (simulated, {profile})", home["history"],
                 RESULTS / "joint_home_convergence.png")
    _write("targets", {"profile": profile, "peak_bytes": trace.peak_load_bytes, "sqrt_n": sqrt_n, "rows": rows,
                       "home_params": _home_targets(), "reduced": REDUCED},
           _targets_md(trace.peak_load_bytes, sqrt_n, rows, profile))


def _home_targets() -> dict:
    """home's parameters in the targets section: its defaults unless a reduced run sets particles."""
    return {"particles": REDUCED["home_particles"]} if "home_particles" in REDUCED else {}


def _reduced_line() -> str:
    return f"Reduced run: {REDUCED}.\n" if REDUCED else ""


def _targets_md(peak_bytes: int, sqrt_n: dict, rows: list[dict], profile: str) -> str:
    out = [(f"resnet50 batch 256, peak {peak_bytes / GIB:.2f} GiB; sqrt-n: peak "
            f"{sqrt_n['peak_bytes'] / GIB:.2f} GiB, overhead {sqrt_n['overhead']:.1%} (simulated, `{profile}`).\n"),
           _reduced_line() + f"home: {_home_targets() or 'defaults (500 particles x 500 iterations)'}.\n",
           "| budget | goal | planner | overhead | met | swaps | recomputes | planning s (wall) | CPU s | load avg |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        met = "yes" if r.get("feasible") and r["overhead"] <= r["goal"] + 1e-12 else "no"
        out.append(f"| {r['case']} ({r['budget_bytes'] / GIB:.2f} GiB) | <= {r['goal']:.1%} | {r['planner']} | "
                   f"{_pct(r)} | {met} | {r.get('swaps', '—')} | {r.get('recomputes', '—')} | "
                   f"{r.get('wall_s', '—')} | {r.get('cpu_s', '—')} | {r.get('load_avg', '—')} |")
    return "\n".join(out) + "\n"


def home_defaults(profile: str) -> None:
    """home with its defaults (500 particles x 500 iterations) at 1/2 of resnet50@256's peak only:
    the planning-time target's case, for when targets ran with fewer particles."""
    trace = traced("resnet50", 256)
    budget = trace.peak_load_bytes // 2
    row = timed_plan(trace, budget, "home", Problem.of(trace, profile=profile).cost)
    history = row.pop("history", None)
    if history:
        plot_history(f"home (defaults) on resnet50@256 at 1/2 of the peak (simulated, {profile})", history,
                     RESULTS / "joint_home_defaults_convergence.png")
    head = f"home with its defaults on resnet50@256 at 1/2 of the peak ({budget / GIB:.2f} GiB), simulated on `{profile}`.\n"
    cells = [_pct(row), row.get("swaps"), row.get("recomputes"), row.get("wall_s"), row.get("cpu_s"), row.get("load_avg")]
    out = [head, "| overhead | swaps | recomputes | planning s (wall) | CPU s | load avg |", "|---|---|---|---|---|---|",
           "| " + " | ".join(map(str, cells)) + " |"]
    _write("home_defaults", {"profile": profile, "budget_bytes": budget, "row": row, "history": history},
           "\n".join(out) + "\n")


# --- pareto --------------------------------------------------------------------------------------------


def pareto(profile: str) -> None:
    """Every model and budget: the best new planner against the best baseline (and milp if present)."""
    milp = _milp_rows()
    data = []
    for item in REDUCED.get("models", PARETO_MODELS):
        model, batch = _split(item)
        trace = traced(model, batch)
        cost = Problem.of(trace, profile=profile).cost
        for share in REDUCED.get("budgets", PARETO_BUDGETS):
            budget = int(share * trace.peak_load_bytes)
            params = {"home:fast": _pareto_home()}
            rows = {name: timed_plan(trace, budget, name, cost, **params.get(name, {}))
                    for name in NEW[1:] + BASELINES}  # home:fast (a time limit) stands for home here
            for row in rows.values():
                row.pop("history", None)
            data.append({"model": item, "share": share, "budget_bytes": budget, "peak_bytes": trace.peak_load_bytes,
                         "rows": rows, "milp": milp.get((item, share))})
            log.info("%s at %.0f%%: %s", item, 100 * share, {k: _pct(v) for k, v in rows.items()})
    _pareto_plot(data)
    _write("pareto", {"profile": profile, "home_params": _pareto_home(), "reduced": REDUCED, "cells": data},
           _pareto_md(data, profile))


def _pareto_home() -> dict:
    return {"time_limit_s": REDUCED.get("fast_limit_s", PARETO_HOME["time_limit_s"])}


def _best(rows: dict, names) -> tuple[str, dict | None]:
    fits = [(r["overhead"], n) for n, r in rows.items() if n in names and r.get("feasible")]
    if not fits:
        return "—", None
    _, name = min(fits)
    return name, rows[name]


def _pareto_md(data: list[dict], profile: str) -> str:
    with_milp = any(c["milp"] for c in data)
    head = ["model", "budget", "best new", "its overhead", "best baseline", "its overhead", "new <= baseline"]
    head += ["milp", "milp gap"] if with_milp else []
    out = [_reduced_line() + f"Simulated on `{profile}`; home:fast with a {_pareto_home()['time_limit_s']:g} s limit "
           "stands for home.\n",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in data:
        new, new_row = _best(c["rows"], NEW)
        base, base_row = _best(c["rows"], BASELINES)
        ok = "yes" if new_row and (not base_row or new_row["overhead"] <= base_row["overhead"] + 1e-9) else \
            ("n/a (none fits)" if not base_row and not new_row else "no")
        line = [c["model"], f"{c['share']:.0%}", new, _pct(new_row), base, _pct(base_row), ok]
        if with_milp:
            m = c["milp"] or {}
            line += [_pct(m) if m else "—", f"{m.get('gap', float('nan')):.1%}" if m else "—"]
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out) + "\n"


def _milp_rows() -> dict:
    """milp's results by (model@batch, budget share), if its benchmark has written them."""
    path = RESULTS / "milp.json"
    if not path.exists():
        return {}
    rows = json.loads(path.read_text()).get("rows", [])
    return {(r.get("model"), r.get("share")): r for r in rows if "overhead" in r}


def _pareto_plot(data: list[dict]) -> None:
    fig, _ = new_figure(12, 8)
    fig.clf()
    for i, item in enumerate(REDUCED.get("models", PARETO_MODELS)):
        ax = fig.add_subplot(2, 2, i + 1)
        cells = [c for c in data if c["model"] == item]
        for name in NEW[1:] + BASELINES:
            pts = [(c["share"] * 100, c["rows"][name]["overhead"] * 100) for c in cells
                   if c["rows"][name].get("feasible")]
            if pts:
                x, y = zip(*sorted(pts))
                ax.plot(x, y, marker="o" if name in NEW else "x", ls="-" if name in NEW else "--", label=name)
        ax.set_title(f"{item} (simulated)")
        ax.set_xlabel("budget (% of peak)")
        ax.set_ylabel("overhead (%)")
        ax.set_yscale("symlog", linthresh=1)
        ax.invert_xaxis()
        if i == 0:
            ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, RESULTS / "joint_pareto.png")


# --- evaluator -----------------------------------------------------------------------------------------


def _min_time(fn, repeats: int = 5) -> float:
    """The least CPU seconds of `repeats` runs of fn (this host's load makes single runs noisy)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def evaluator(profile: str) -> None:
    """Milliseconds per evaluation of Algorithm 3's kind (a policy and its one-entry neighbours)."""
    trace = traced("resnet50", 256)
    cost = Problem.of(trace, profile=profile).cost
    fm = feature_maps(trace)
    ev = PolicyEvaluator(fm, cost, trace.peak_load_bytes // 2)
    rng = np.random.default_rng(1)
    base = random_policies(fm.allowed(), 40, np.random.default_rng(0))
    policies = []
    for i in range(400):
        p = base[i % len(base)].copy()
        j = int(rng.integers(len(p)))
        p[j] = rng.choice(np.flatnonzero(fm.allowed()[j]))
        policies.append(p)
    plans = [ev.plan(p) for p in policies]
    budget = ev.budget_bytes
    off = Simulator(trace, cost)
    off._chain_memo = None  # chains recomputed for every plan, as before memplan.sim.memo

    def without_memo():
        for q in plans:
            off._recent_chains.clear()
            off.run(q, budget)

    per = 1e3 / len(plans)
    rows = {"decode (policy -> decisions)": _min_time(lambda: [ev.decode(p) for p in policies]) * per,
            "simulate, chains recomputed every time": _min_time(without_memo) * per,
            "simulate, chains reused (memplan.sim.memo)": _min_time(
                lambda: [ev.simulator.run(q, budget) for q in plans]) * per,
            "  of which plan preparation": _min_time(lambda: [ev.simulator._plan_arrays(ev.simulator.lower(q.decisions))
                                                              for q in plans]) * per}
    rows["  of which kernel and result"] = rows["simulate, chains reused (memplan.sim.memo)"] \
        - rows["  of which plan preparation"]
    forward = float(np.mean(fm.out_after / len(trace.ops)))
    out = [(f"resnet50@256 at 1/2 of its peak, {len(fm)} feature maps; 400 policies, each a random one with one "
            f"entry changed (what Algorithm 3 evaluates); least CPU time of 5 passes, load average "
            f"{os.getloadavg()[0]:.1f}.\n"), "| part | ms per evaluation |", "|---|---|"]
    out += [f"| {k} | {v:.3f} |" for k, v in rows.items()]
    out.append(f"\nA feature map's decision first matters at its last forward access, on average {forward:.0%} "
               f"into the ops: resuming the kernel there would skip at most that share of the kernel's time.")
    _write("evaluator", {"profile": profile, "ms": rows, "forward_prefix_share": forward}, "\n".join(out) + "\n")


# --- parallel ------------------------------------------------------------------------------------------


class _ThreadChunk:
    """A chunk run by a thread (to compare with processes: the GIL serialises the Python parts)."""

    def __init__(self, score, policies):
        self.chunk, self.thread, self.result = Chunk(score=score, policies=policies.copy()), None, None

    def submit(self, method, *args):
        def run():
            self.result = getattr(self.chunk, method)(*args)

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def collect(self):
        self.thread.join()
        return self.result

    def close(self):
        pass


def parallel(profile: str) -> None:
    """The same search over 1 process, 2 processes and 2 threads."""
    trace = traced("resnet50", 256)
    cost = Problem.of(trace, profile=profile).cost
    budget = trace.peak_load_bytes // 2
    rows, particles = [], REDUCED.get("parallel_particles", PARALLEL_PARTICLES)
    real = home_module.make_chunks
    for label, workers in (("1 process", 1), ("2 processes", 2), ("2 threads", 2)):
        if label.endswith("threads"):
            home_module.make_chunks = lambda score, policies, w: [_ThreadChunk(score, b)
                                                                   for b in np.array_split(policies, w)]
        try:
            row = timed_plan(trace, budget, "home", cost, particles=particles, workers=workers)
        finally:
            home_module.make_chunks = real
        rows.append({"mode": label, **{k: v for k, v in row.items() if k != "history"}})
        log.info("%s: %s", label, rows[-1])
    out = [_reduced_line() + f"home, {particles} particles, resnet50@256 at 1/2 of the peak: the same search three ways.\n",
           "| mode | overhead | planning s (wall) | CPU s | load avg |", "|---|---|---|---|---|"]
    out += [f"| {r['mode']} | {_pct(r)} | {r['wall_s']} | {r['cpu_s']} | {r['load_avg']} |" for r in rows]
    _write("parallel", {"profile": profile, "rows": rows}, "\n".join(out) + "\n")


# --- HOME Table 2 --------------------------------------------------------------------------------------


class _Plain(nn.Module):
    """Plain-20 (He et al. 2016, CIFAR): ResNet-20 without its shortcuts."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers, cin = [nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)], 16
        for stage, width in enumerate((16, 32, 64)):
            for i in range(6):
                stride = 2 if stage and i == 0 else 1
                layers += [nn.Conv2d(cin, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
                cin = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


def plain20(batch: int, input_size: int = 32, device="cpu", seed: int = 0):
    """The Plain-20 workload (not in the zoo; HOME's Table 2 uses it)."""
    spec = ModelSpec(name="plain20", summary="Plain-20, CIFAR-10", build=lambda config, size: _Plain(),
                     make_inputs=image_inputs, loss=classify_loss, defaults={"num_classes": 10}, input_size=32)
    return build_workload(spec, batch=batch, input_size=input_size, device=device, seed=seed,
                          config={"num_classes": 10, "lr": SGD_LR, "optimizer": "sgd"})


TABLE2_MODELS = {  # HOME's six CIFAR models: name -> (zoo model or factory, trace options)
    "MobileNet": ("mobilenet_v1", {"input_size": 32, "num_classes": 10}),
    "Plain20": (plain20, {}),
    "SqueezeNet": ("squeezenet", {"input_size": 32, "num_classes": 10}),
    "VGG16": ("vgg16-cifar", {}),
    "ResNet": ("resnet50-cifar", {}),
    "InceptionV3": ("inception_v3", {"num_classes": 10}),  # 299x299: it needs at least 75x75
}
PAPER_TABLE2 = {"MobileNet": (2012, 3954, 4200), "Plain20": (1040, 2843, 2926), "SqueezeNet": (1667, 4056, 4347),
                "VGG16": (2759, 4250, 5125), "ResNet": (1255, 2014, 2576), "InceptionV3": (125, 345, 365)}


def table2(profile: str) -> None:
    """The largest batch that fits TABLE2_MEMORY, per model and planner, with simulated throughput."""
    rows = []
    for label, (model, options) in TABLE2_MODELS.items():
        if label not in REDUCED.get("table2_models", TABLE2_MODELS):
            continue
        for name in TABLE2_PLANNERS:
            best, row = _largest_batch(model, options, name, profile)
            throughput = best / row["time_s"] if best else 0.0
            rows.append({"model": label, "planner": name, "max_batch": best, "throughput": throughput,
                         "overhead": row.get("overhead"), "time_s": row.get("time_s")})
            log.info("%s %s: batch %d, %.0f samples/s", label, name, best, throughput)
    _write("table2", {"profile": profile, "memory_bytes": TABLE2_MEMORY, "home_params": TABLE2_HOME, "reduced": REDUCED,
                      "rows": rows},
           _table2_md(rows, profile))


def _largest_batch(model, options: dict, name: str, profile: str) -> tuple[int, dict]:
    """The largest batch whose plan by `name` fits TABLE2_MEMORY, and that plan's row."""
    fits_at: dict[int, dict] = {}
    params = TABLE2_HOME if name.startswith("home") else {}

    def fits(batch: int) -> bool:
        trace = traced(model, batch, **options)
        row = timed_plan(trace, TABLE2_MEMORY, name, Problem.of(trace, profile=profile).cost, **params)
        ok = row.get("feasible", False) and row["peak_bytes"] <= TABLE2_MEMORY
        if ok:
            fits_at[batch] = row
        return ok

    best = search(fits, TABLE2_LIMIT)
    return best, fits_at.get(best, {})


def _table2_md(rows: list[dict], profile: str) -> str:
    names = TABLE2_PLANNERS
    head = ["model"] + [f"max batch {n}" for n in names] + [f"samples/s {n}" for n in names]
    head += ["paper batch PyT./Cap./HOME"]
    out = [(f"Largest batch under {TABLE2_MEMORY / GIB:g} GiB, simulated on `{profile}` (throughput = batch / "
            f"simulated iteration time at that batch); home:fast with {TABLE2_HOME}.\n"),
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out[0] = _reduced_line() + out[0]
    ratios = []
    for label in dict.fromkeys(r["model"] for r in rows):
        by = {r["planner"]: r for r in rows if r["model"] == label}
        line = [label] + [str(by[n]["max_batch"]) for n in names] + [f"{by[n]['throughput']:.0f}" for n in names]
        line.append("/".join(map(str, PAPER_TABLE2[label])))
        out.append("| " + " | ".join(line) + " |")
        if by["none"]["max_batch"]:
            ratios.append({n: by[n]["max_batch"] / by["none"]["max_batch"] for n in names})
    if ratios:
        mean = {n: float(np.mean([r[n] for r in ratios])) for n in names}
        if any(r["max_batch"] >= TABLE2_LIMIT for r in rows):
            out.append(f"\n{TABLE2_LIMIT} is the largest batch probed: there the ratio is a lower bound.")
        out.append("\nMean batch over none's: " + ", ".join(f"{n} {v:.2f}x" for n, v in mean.items())
                   + " (paper: Capuchin 1.97x, HOME 2.2x).")
    return "\n".join(out) + "\n"


SECTIONS = {"targets": targets, "home_defaults": home_defaults, "pareto": pareto, "evaluator": evaluator, "parallel": parallel, "table2": table2}


def render(section: str) -> None:
    """Rewrite joint_<section>.md from its .json (targets, pareto), e.g. after a change of format."""
    data = json.loads((RESULTS / f"joint_{section}.json").read_text())
    REDUCED.clear()
    REDUCED.update(data.get("reduced") or {})
    if section == "targets":
        md = _targets_md(data["peak_bytes"], data["sqrt_n"], data["rows"], _profile_of(data))
    else:
        md = _pareto_md(data["cells"], _profile_of(data))
    atomic_write_text(RESULTS / f"joint_{section}.md", md)
    print(md)


def _profile_of(data: dict) -> str:
    """The cost profile a results file was simulated on (files written before issue 38 call it "device")."""
    return data.get("profile", data.get("device", DEFAULT_PROFILE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="the cost model's device profile")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--render", action="store_true", help="rewrite the --only sections' .md from their .json")
    reduced = parser.add_argument_group("a reduced run (recorded in the results)")
    reduced.add_argument("--home-particles", type=int, help="home's particles in targets (default 500)")
    reduced.add_argument("--models", help="comma-separated model@batch for pareto")
    reduced.add_argument("--budgets", help="comma-separated budget shares for pareto")
    reduced.add_argument("--fast-limit-s", type=float, help="home:fast's time limit in pareto")
    reduced.add_argument("--parallel-particles", type=int, help="particles in parallel")
    reduced.add_argument("--table2-models", help="comma-separated HOME Table 2 models")
    args = parser.parse_args()
    for key, value in vars(args).items():
        if value is not None and key not in ("profile", "only", "render"):
            REDUCED[key] = value.split(",") if key in ("models", "table2_models") else \
                [float(v) for v in value.split(",")] if key == "budgets" else value
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in args.only.split(","):
        render(name) if args.render else SECTIONS[name](args.profile)


if __name__ == "__main__":
    main()

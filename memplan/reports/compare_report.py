"""The report of `memplan compare`: one Markdown file and one PNG per model.

Per model: the simulated points (peak load against overhead, on the cost model's
profile), the measured points (the meter's peak against the median step time, overhead
against the measured `none` run), each table marking the Pareto front (no other point has
both a lower or equal peak and a lower or equal overhead, one of them strictly), and the
largest batch of each planner under the fixed cap. Every figure names its source.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..fileio import atomic_write_text
from ..plots import save_figure, subplots
from ..units import format_bytes

REPORT_NAME = "compare.md"
PERCENT = 100.0
MIB = 2**20


def pareto(points: list[dict]) -> set[int]:
    """Indices of the points (with "peak_bytes" and "overhead") that no other point dominates."""
    front = set()
    for i, p in enumerate(points):
        dominated = any(q["peak_bytes"] <= p["peak_bytes"] and q["overhead"] <= p["overhead"]
                        and (q["peak_bytes"], q["overhead"]) != (p["peak_bytes"], p["overhead"])
                        for q in points)
        if not dominated:
            front.add(i)
    return front


def with_measured_overhead(points: list[dict]) -> list[dict]:
    """Measured points of one model with "overhead": median step time / the `none` run's - 1."""
    none = next((p for p in points if p["method"] == "none" and "step_s" in p), None)
    out = []
    for p in points:
        if "step_s" in p and none is not None:
            p = {**p, "overhead": p["step_s"] / none["step_s"] - 1.0}
        out.append(p)
    return out


def write_report(result: dict, out_dir: str | Path, command: str) -> dict:
    """Write compare.md and compare-<model>.png under `out_dir`; returns {"report", "plots"}."""
    folder = Path(out_dir)
    models = list(dict.fromkeys(p["model"] for p in result["points"]))
    lines = ["# memplan compare", "", f"Produced by: `{command}`", "",
             "Simulated figures come from the simulator on the named profile with fake-tensor traces; measured "
             f"figures from real training on this machine's {_measured_on(result['points'])} (peak by the memory "
             "meter over two steps, time the median of the unmetered steps after them). PyTorch's tools (`torch:NAME`) run only measured (the simulator prices plans, "
             "and the planners `checkpoint-all` / `save-on-cpu` are their simulated counterparts).", "",
             f"Measured step times depend on what else the host runs ({os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f} when this report was written): on a shared host they are noisy, measured "
             "peaks are not.", ""]
    plots = []
    for model in models:
        mine = [p for p in result["points"] if p["model"] == model]
        sim = [p for p in mine if p["kind"] == "simulated"]
        run = with_measured_overhead([p for p in mine if p["kind"] == "measured"])
        plot = folder / f"compare-{_safe(model)}.png"
        plot_model(model, sim, run, plot)
        title = _title(run[0]["source"]) if run else "Measured"
        plots.append(str(plot))
        lines += [f"## {model}", "", f"![{model}]({plot.name})", ""]
        lines += _points_table(sim, "Simulated", "peak load")
        lines += _points_table(run, title, "measured peak")
        lines += _maxbatch_table([p for p in mine if p["kind"] == "maxbatch"])
    report = folder / REPORT_NAME
    atomic_write_text(report, "\n".join(lines) + "\n")
    return {"report": str(report), "plots": plots}


def _points_table(points: list[dict], title: str, peak: str) -> list[str]:
    if not points:
        return []
    ok = [p for p in points if p.get("overhead") is not None]
    front = {id(ok[i]) for i in pareto(ok)}
    source = points[0]["source"]
    lines = [f"### {title}: batch {points[0]['batch']}, {source}", "",
             f"| method | budget | {peak} | overhead | Pareto |", "| --- | --- | ---: | ---: | :---: |"]
    for p in points:
        if p.get("error"):
            lines.append(f"| {p['method']} | {p['budget']} | - | {_short(p['error'])} | |")
            continue
        over = f"{p['overhead'] * PERCENT:.1f}%" if p.get("overhead") is not None else "-"
        lines.append(f"| {p['method']} | {p['budget']} | {format_bytes(p['peak_bytes'])} | {over} | "
                     f"{'*' if id(p) in front else ''} |")
    return lines + [""]


def _maxbatch_table(points: list[dict]) -> list[str]:
    done = [p for p in points if "max_batch" in p]
    if not points:
        return []
    cap = f" under {format_bytes(done[0]['memory_bytes'])}" if done else ""
    head = f"### Largest batch{cap}, {points[0]['source']}"
    lines = [head, "", "| planner | max batch |", "| --- | ---: |"]
    lines += [f"| {p['method']} | {p.get('max_batch', _short(p.get('error', '')))} |" for p in points]
    return lines + [""]


def plot_model(model: str, sim: list[dict], run: list[dict], path: Path) -> None:
    """Two panels, simulated and measured: overhead against peak per method, the Pareto front as a line."""
    fig, axes = subplots(1, 2, figsize=(13, 4.8))
    for ax, points, title in ((axes[0], sim, "simulated"), (axes[1], run, run[0]["source"] if run else "measured")):
        _panel(ax, [p for p in points if p.get("overhead") is not None], f"{model}: {title}")
    save_figure(fig, path)


def _panel(ax, points: list[dict], title: str) -> None:
    for method in dict.fromkeys(p["method"] for p in points):
        mine = [p for p in points if p["method"] == method]
        ax.scatter([p["peak_bytes"] / MIB for p in mine], [p["overhead"] * PERCENT for p in mine], s=18, label=method)
    front = sorted((points[i]["peak_bytes"], points[i]["overhead"]) for i in pareto(points))
    if front:
        ax.plot([x / MIB for x, _ in front], [y * PERCENT for _, y in front], color="black", lw=1, ls="--",
                label="Pareto front")
    ax.set_xlabel("peak memory (MiB)")
    ax.set_ylabel("overhead (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=6, ncol=2)


def _measured_on(points: list[dict]) -> str:
    """What the measured points ran on, from their sources ("measured (CPU)" -> "CPU")."""
    sources = dict.fromkeys(p["source"].removeprefix("measured (").removesuffix(")")
                            for p in points if p["kind"] == "measured")
    return " and ".join(sources) or "CPU"


def _title(source: str) -> str:
    return source[:1].upper() + source[1:]


def _short(error: str) -> str:
    return "infeasible" if "infeasible" in error else error[:60].replace("|", "/")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

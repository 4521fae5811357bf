"""`memplan report`: one self-contained HTML page that shows a plan on its trace.

    memplan.write_report(trace, plan, "report.html")          # memplan report PLAN TRACE -o report.html

The page shows, on the simulated time axis of one step, the memory load without the plan and
under it with the budget line; the compute stream and the two copy engines; and every
storage's fate: kept, swapped (its device-to-host and host-to-device transfers, the time it
spends on the host) or recomputed (the ops replayed and when), with the predicted step time
and overhead. Everything comes from the simulator (memplan.sim) and the plan's step program
(`compile_program`, `residencies`): the page draws what the executor would do.

The page is one file: its data is JSON inside it and its charts are SVG that a short inline
script draws (memplan/reports/plan_report.js; styles in plan_report.html), so it opens
offline and loads nothing (its Content-Security-Policy forbids any load). Long timelines keep
each interval's highest load; storages beyond `MAX_ROWS` rows show the largest kept ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from .. import Cost, Plan, Problem, Trace
from ..services import (ActionKind, Rebuild, ReplayStep, check_plan, compile_program, plan_cost, program_residencies,
                        simulator_of)
from ..budget import bytes_label, bytes_to_json
from ..fileio import atomic_write_text, check_output_path

_NO_REBUILD = Rebuild(steps=())
MAX_POINTS = 4000  # load-curve points per curve (each kept point is the highest load of its interval)
MAX_ROWS = 400  # storage rows: every decided storage, then the largest kept ones
DATA_MARK = "/*MEMPLAN_DATA*/null"  # where the page's data goes in plan_report.html
SCRIPT_MARK = "/*MEMPLAN_SCRIPT*/"  # where plan_report.js goes


def write_report(trace: Trace, plan: Plan, path: str | os.PathLike, profile: str | None = None) -> dict:
    """Write the HTML report of `plan` on `trace` to `path` (whole or not at all).

    Args:
        trace: the traced iteration.
        plan: a plan made for it.
        path: the .html file to write.
        profile: the cost model's device profile to time it on (None: the one the plan was made for).
    Returns:
        A summary: the path, its size in bytes, and the numbers the page shows.
    Raises:
        PlanMismatchError: the plan is for another trace.
        MemplanError: a bad profile, a plan that does not fit its budget, a path that cannot be written.
    """
    check_output_path(path, "HTML")
    data = report_data(trace, plan, profile)
    text = render(data)
    atomic_write_text(path, text)
    return {"report": str(path), "bytes": len(text.encode()), **data["summary"]}


def render(data: dict) -> str:
    """The page, with `data` in it (no `</` inside the script, so no text can close it)."""
    page = resources.files(__package__).joinpath("plan_report.html").read_text()
    script = resources.files(__package__).joinpath("plan_report.js").read_text()
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return page.replace(DATA_MARK, payload).replace(SCRIPT_MARK, script)


def report_data(trace: Trace, plan: Plan, profile: str | None = None) -> dict:
    """Everything the page draws, as JSON-ready data (times in seconds, sizes in bytes)."""
    check_plan(trace, plan)
    problem = Problem(trace, plan_cost(trace, plan, profile))
    cost, sim = problem.cost, simulator_of(problem)
    program = compile_program(problem, plan)
    planned = sim.run(plan, program.budget_bytes, timeline=True)
    plain = sim.run(None, timeline=True)
    starts = planned.op_start_s
    ends = starts + cost.durations
    return {
        "summary": _summary(trace, plan, planned, plain, cost),
        "load": {"plan": _curve(planned), "plain": _curve(plain), "budget": bytes_to_json(program.budget_bytes),
                 "end_s": float(planned.time_s), "plain_end_s": float(plain.time_s)},
        "lanes": {lane: _rounded(spans) for lane, spans in planned.lanes.items()},
        "storages": _storage_rows(trace, program, _Times(starts=starts, ends=ends, cost=cost, lanes=planned.lanes)),
        "ops": {"names": [op.name.removeprefix("aten.") for op in trace.ops], "modules": [op.module for op in trace.ops],
                "start_s": _rounded(starts.tolist()), "end_s": _rounded(ends.tolist())},
    }


def _summary(trace: Trace, plan: Plan, planned, plain, cost: Cost) -> dict:
    actions = [d.action for d in plan.decisions]
    return {"model": str(trace.meta.get("model", trace.meta.get("source", "trace"))), "batch": trace.meta.get("batch"),
            "planner": plan.planner, "profile": cost.profile.name, "budget_bytes": bytes_to_json(plan.budget_bytes),
            "plain_peak_bytes": int(plain.peak_load_bytes), "peak_bytes": int(planned.peak_load_bytes),
            "time_s": float(planned.time_s), "baseline_time_s": float(planned.baseline_time_s),
            "overhead": float(planned.overhead), "breakdown": planned.breakdown,
            "host_peak_bytes": int(planned.host_peak_bytes), "link_bytes": int(planned.link_bytes),
            "storages": len(trace.storages), "ops": len(trace.ops),
            "swapped": len({d.storage for d in plan.decisions if d.action == "swap"}),
            "recomputed": len({d.storage for d in plan.decisions if d.action == "recompute"}),
            "decisions": {a: actions.count(a) for a in sorted(set(actions))},
            "budget": bytes_label(plan.budget_bytes)}


def _curve(result) -> list[list]:
    """[[time, load], ...] of a simulated load timeline, at most MAX_POINTS, each interval's highest load."""
    t, load = np.asarray(result.timeline_t, dtype=float), np.asarray(result.timeline_load, dtype=np.int64)
    if len(t) > MAX_POINTS:
        bucket = np.minimum((t / max(t[-1], 1e-30) * (MAX_POINTS - 1)).astype(int), MAX_POINTS - 1)
        first = np.unique(bucket, return_index=True)[1]
        load = np.maximum.reduceat(load, first)
        t = t[first]
    return [[round(float(x), 12), int(y)] for x, y in zip(t, load)]


def _rounded(values) -> list:
    """Seconds to the picosecond: enough for any step, and a short page."""
    return json.loads(json.dumps(values), parse_float=lambda s: round(float(s), 12))


def _storage_rows(trace: Trace, program, times: "_Times") -> dict:
    """One row per storage shown: its residency intervals, transfers and recomputations."""
    copies = _copy_spans(trace, program, times)
    released = {(program.decisions[a.decision].storage, a.op): copies[a.decision, "d2h"][1]
                for a in program.actions if a.kind == ActionKind.RELEASE}
    resident: dict[int, list] = {}
    for sid, start, end, how in program_residencies(trace, program):
        # a swapped-out storage's bytes are free once its copy is done; other storages go as op `end - 1` ends
        until = released.get((sid, end), times.begin(end)) if how == "offload" else times.end(end)
        resident.setdefault(sid, []).append([times.begin(start), until])
    events = _decision_events(trace, program, times, copies)
    fates = {}
    for d in program.decisions:
        fates.setdefault(d.storage, set()).add(d.action)
    shown = sorted(fates) + sorted((s.id for s in trace.storages if s.id not in fates and s.id in resident),
                                   key=lambda sid: -trace.storages[sid].nbytes)[:max(0, MAX_ROWS - len(fates))]
    rows = [_row(trace, sid, fates.get(sid, {"keep"}), resident.get(sid, []), events.get(sid, []))
            for sid in shown]
    rows.sort(key=lambda r: (r["fate"] == "keep", r["t"][0][0] if r["t"] else 0.0))
    kept = sum(1 for sid in resident if sid not in fates)
    return {"rows": rows, "hidden": kept - sum(r["fate"] == "keep" for r in rows)}


def _row(trace: Trace, sid: int, fate: set, resident: list, events: list) -> dict:
    storage = trace.storages[sid]
    return {"id": sid, "bytes": storage.nbytes, "kind": storage.kind, "name": storage.name or _made_by(trace, sid),
            "fate": "+".join(sorted(fate)), "t": _rounded(resident), "x": events}


def _made_by(trace: Trace, sid: int) -> str:
    """An unnamed storage by the op that writes it first: "layer1.0.conv1 convolution"."""
    op = trace.producer(sid)
    if op is None:
        return ""
    name = trace.ops[op].name.removeprefix("aten.").split(".")[0]
    return f"{trace.ops[op].module} {name}".strip()


@dataclass(frozen=True)
class _Times:
    """The simulated time axis of the planned step."""

    starts: np.ndarray  # when each op starts running (after any wait)
    ends: np.ndarray  # when each op ends
    cost: Cost  # its op durations and copy times
    lanes: dict = field(default_factory=dict)  # the copy engines' busy intervals, as the simulator ran them

    def begin(self, op: int) -> float:
        """When the work before op `op` begins (its allocations and prefetches): as op `op - 1` ends."""
        return float(self.ends[op - 1]) if 0 < op <= len(self.ends) else 0.0

    def end(self, op: int) -> float:
        """When storages gone from op `op` on are released: as op `op - 1` ends."""
        return float(self.ends[max(op, 1) - 1])


def _copy_spans(trace: Trace, program, times: _Times) -> dict[tuple[int, str], tuple[float, float]]:
    """(decision, "d2h"/"h2d") -> the copy's (start, end): the simulated copy engines' intervals,
    which run in the order the program issues them; as the cost model prices each copy from the
    point it is issued when the engines ran another number of copies (a cancelled prefetch)."""
    issued = {"d2h": [a for a in program.actions if a.kind == ActionKind.SWAP_OUT],
              "h2d": [a for a in program.actions if a.kind == ActionKind.PREFETCH]}
    out = {}
    for lane, actions in issued.items():
        spans = times.lanes.get(lane, [])
        for k, a in enumerate(actions):
            d = program.decisions[a.decision]
            if len(spans) == len(actions):
                out[a.decision, lane] = tuple(spans[k])
                continue
            link = trace.storages[d.storage].nbytes * (d.compress_ratio or 1.0)
            start = float(times.ends[a.op]) if lane == "d2h" else times.begin(a.op)
            out[a.decision, lane] = (start, start + (times.cost.d2h_s if lane == "d2h" else times.cost.h2d_s)(link))
    return out


def _recompute_steps(trace: Trace, program, action, ran: set) -> list:
    """What recompute `action` runs: its replay chain's steps, or in a hooked program (memplan.sim.lowering)
    its module call's ops once per run (the run's other storages are adopted from it)."""
    if program.level != "hooked":
        return [s for s in program.rebuilds.get(action.decision, _NO_REBUILD).steps if s.ops]
    run = program.regions[action.decision]
    if (run, action.op) in ran:
        return []
    ran.add((run, action.op))
    ops = tuple(range(trace.calls[run.call].first_op, run.stop))
    return [ReplayStep(storage=program.decisions[action.decision].storage, ops=ops, temporary=False)]


def _decision_events(trace: Trace, program, times: _Times, copies: dict) -> dict[int, list]:
    """Per storage: its transfers ["d2h"/"h2d", start, end] and its recomputations ["recompute",
    start, end, first op, last op] (the ops replayed, in the chains that run just before the op
    that needs it: a chain rebuilds its inputs first, and a storage another chain's replay makes
    as well, batch norm's statistics beside its output, is adopted from that replay)."""
    out: dict[int, list] = {}
    replays: dict[int, list] = {}  # op -> (ops, event) of every chain step run before it
    adopted = []
    ran: set = set()  # (region run, op) of a hooked program's runs so far
    for a in program.actions:
        sid = program.decisions[a.decision].storage
        if a.kind in (ActionKind.SWAP_OUT, ActionKind.PREFETCH):
            lane = "d2h" if a.kind == ActionKind.SWAP_OUT else "h2d"
            out.setdefault(sid, []).append(_rounded([lane, *copies[a.decision, lane]]))
        elif a.kind == ActionKind.RECOMPUTE:
            steps = _recompute_steps(trace, program, a, ran)
            if not steps:
                adopted.append((sid, a.op))
            seconds = [float(times.cost.durations[list(s.ops)].sum()) for s in steps]
            t = float(times.starts[a.op]) - sum(seconds)
            for step, took in zip(steps, seconds):
                event = _rounded(["recompute", t, t + took, min(step.ops), max(step.ops)])
                out.setdefault(step.storage, []).append(event)
                replays.setdefault(a.op, []).append((step.ops, event))
                t += took
    for sid, op in adopted:
        out.setdefault(sid, []).extend(e for ops, e in replays.get(op, ()) if any(sid in trace.ops[j].writes for j in ops))
    return out

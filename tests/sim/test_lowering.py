"""Plans lowered onto the hooked executor's points and regions (memplan.sim.lowering), and the host's work
the simulator prices at each level. Oracles: the validator, the trace's own records read here afresh, and
sums worked out by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import memplan
from memplan.budget import NO_LIMIT
from memplan.cost.model import Cost
from memplan.cost.profiles import get_profile
from memplan.model import Plan
from memplan.model.hooksites import HookSites
from memplan.planners.kit.blocks import block_calls
from memplan.problem import Problem
from memplan.sim.program import compile_program
from memplan.sim.simulate import Simulator
from memplan.sim.validate import OVER_BUDGET, validate

GPT2 = {"n_layer": 6, "n_embd": 64, "n_head": 2, "vocab_size": 256, "seq_len": 64}
HOST = {"host_op_s": 0.0, "hook_s": 0.0, "hook_call_s": 0.0, "mode_op_s": 0.0, "replay_op_s": 0.0, "action_s": 0.0}


@pytest.fixture(scope="module")
def gpt2():
    return memplan.trace_workload("hf:gpt2", 1, fake=True, **GPT2)


@pytest.fixture(scope="module")
def resnet():
    return memplan.trace_workload("resnet18-cifar", 4, fake=True)


def _lowered(trace, planner, budget="90%", **params):
    plan = memplan.plan(trace, budget, planner=planner, **params)
    return plan, Simulator(trace, Problem.of(trace).cost).lower(plan.decisions)


def test_the_tracer_records_every_pack_and_the_blocks(gpt2):
    assert gpt2.saved and all(s.storage is not None and s.unpacked_at is not None for s in gpt2.saved)
    assert all(s.packed_at <= s.unpacked_at for s in gpt2.saved)
    assert [c.module for c in block_calls(gpt2)] == [f"transformer.h.{i}" for i in range(GPT2["n_layer"])]
    for call in gpt2.calls:  # a call's packs were made while it ran
        assert all(call.first_op <= gpt2.saved[k].packed_at <= call.end_op for k in range(call.first_saved, call.end_saved))


@pytest.mark.parametrize("planner", ["sqrt-n", "dtr", "save-on-cpu"])
def test_a_hooked_plan_acts_only_at_hook_points_and_stays_valid(gpt2, planner):
    plan, lowered = _lowered(gpt2, planner, "85%")
    assert lowered.level == "hooked"
    assert [v for v in validate(gpt2, Plan(decisions=lowered.decisions)) if v.kind != OVER_BUDGET] == []
    points = set(HookSites(gpt2).points)
    program = compile_program(Problem.of(gpt2), plan)
    assert program.level == "hooked"
    for a in program.actions:
        if a.kind.value in ("swap_out", "drop", "prefetch", "recompute"):
            assert (a.op + 1 if a.after else a.op) in points, a
    for d in lowered.decisions:  # every storage leaves after its first pack, and comes back in backward
        first = min(s.packed_at for s in gpt2.saved if s.storage == d.storage)
        assert first <= d.out_after + 1 and gpt2.ops[d.back_before].phase == "backward"


def test_a_region_run_makes_what_it_captures_from_what_is_there(gpt2):
    plan, lowered = _lowered(gpt2, "dtr", "85%")
    away = [(d.storage, d.out_after, d.back_before) for d in lowered.decisions]
    for k, run in lowered.regions.items():
        call, at = gpt2.calls[run.call], lowered.decisions[k].back_before
        assert call.module  # never the model's own call
        for index, sid in run.captures:
            assert call.first_saved <= index < call.end_saved and gpt2.saved[index].storage == sid
            assert call.first_op <= gpt2.producer(sid) < run.stop <= call.end_op
        for i in range(call.first_op, run.stop):
            for r in gpt2.ops[i].reads:
                s = gpt2.storages[r]
                if s.alloc_op < call.first_op:  # an input: alive then, or held as an argument; never away
                    assert s.alloc_op <= at < s.free_op or r in call.args
                    assert not any(sid == r and lo < at < hi for sid, lo, hi in away)


def test_sqrt_n_runs_each_block_once_as_torch_checkpoint_does(gpt2):
    _, lowered = _lowered(gpt2, "sqrt-n", None)
    runs = {(run.call, lowered.decisions[k].back_before) for k, run in lowered.regions.items()}
    assert sorted(gpt2.calls[c].module for c, _ in runs) == [c.module for c in block_calls(gpt2)]


def test_what_cannot_be_hooked_runs_interpreted(gpt2, resnet):
    sim = Simulator(gpt2, Problem.of(gpt2).cost)
    assert sim.lower(()).level == "plain"
    unrecorded = dataclasses.replace(gpt2, saved=(), calls=())
    plan = memplan.plan(gpt2, "85%", planner="dtr")
    assert Simulator(unrecorded, Problem.of(unrecorded).cost).lower(plan.decisions).level == "interpreted"
    micro = memplan.plan(resnet, None, planner="ucudnn:wr")
    assert micro.microbatches and memplan.simulate(resnet, micro).level == "interpreted"


def test_the_cpu_host_adds_its_work_and_a_gpu_host_runs_ahead(gpt2):
    durations = Cost.for_trace(gpt2, "h100").durations
    n = len(gpt2.ops)
    cpu = dataclasses.replace(get_profile("h100"), kind="cpu", **{**HOST, "host_op_s": 1e-5})
    assert Simulator(gpt2, Cost(profile=cpu, durations=durations, priced_host=True)).baseline_time_s == \
        pytest.approx(durations.sum() + n * 1e-5)
    gpu = dataclasses.replace(get_profile("h100"), **{**HOST, "host_op_s": 1e-5})
    busy = np.full(n, 1e-3)  # the device always slower: only the first op waits for the host
    assert Simulator(gpt2, Cost(profile=gpu, durations=busy, priced_host=True)).baseline_time_s == pytest.approx(busy.sum() + 1e-5)
    idle = np.zeros(n)  # the device always faster: the host's pace
    assert Simulator(gpt2, Cost(profile=gpu, durations=idle, priced_host=True)).baseline_time_s == pytest.approx(n * 1e-5)


def _host_cost(trace, **host):
    cpu = dataclasses.replace(get_profile("h100"), kind="cpu", copy_latency_s=0.0, d2h_bytes_per_s=1e30,
                              h2d_bytes_per_s=1e30, **{**HOST, **host})  # copies that take no time
    return Cost(profile=cpu, durations=np.zeros(len(trace.ops)), priced_host=True)


def test_a_hooked_plan_pays_for_the_hooks_it_needs_and_no_others(gpt2):
    # one swap of a tensor the first block's MLP activation saves: its pack and unpack, and everything its
    # innermost call (the window around that pack) saves, and that module's hooks; nothing else
    sid = next(s.storage for s in gpt2.saved if s.storage is not None and gpt2.storages[s.storage].kind == "activation"
               and any(c.module == "transformer.h.0.mlp.act" and c.first_saved <= k < c.end_saved
                       for c in gpt2.calls for k in [gpt2.saved.index(s)]))
    packs = [s for s in gpt2.saved if s.storage == sid]
    acc = gpt2.accesses[sid]
    out = max(i for i in acc if gpt2.ops[i].phase == "forward")
    back = min(i for i in acc if gpt2.ops[i].phase == "backward")
    plan = Plan(decisions=(memplan.Decision(storage=sid, action="swap", out_after=out, back_before=back),))
    act = [c for c in gpt2.calls if c.module == "transformer.h.0.mlp.act"]
    window = [s for c in act for s in gpt2.saved[c.first_saved:c.end_saved]]
    assert set(map(id, packs)) <= set(map(id, window))
    calls = 2 * len(act)  # the module's forward pre-hook and forward hook, once per call
    expected = len(window) + sum(s.unpacked_at is not None for s in window) + calls
    hooked = Simulator(gpt2, _host_cost(gpt2, hook_call_s=1e-6)).hooked(plan, NO_LIMIT)
    assert hooked.level == "hooked"
    assert hooked.breakdown["host_s"] == pytest.approx(expected * 1e-6)


def test_each_level_pays_its_host_work(gpt2):
    plan = memplan.plan(gpt2, "85%", planner="save-on-cpu")
    cpu = _host_cost(gpt2, hook_s=1e-6, hook_call_s=1e-6).profile  # identity hooks, the hooked executor's hooks
    hooked = Simulator(gpt2, _host_cost(gpt2, hook_call_s=1e-6)).hooked(plan, NO_LIMIT)
    events = len(gpt2.saved) + sum(s.unpacked_at is not None for s in gpt2.saved)
    moved = {d.storage for d in plan.decisions}
    mandatory = sum(1 + (s.unpacked_at is not None) for s in gpt2.saved if s.storage in moved)
    hooks = 2 * len(gpt2.calls) + len(gpt2.marks)
    assert mandatory * 1e-6 <= hooked.breakdown["host_s"] <= (events + hooks) * 1e-6  # moved tensors' hooks at least
    moded = dataclasses.replace(cpu, mode_op_s=2e-6)
    interpreted = Simulator(gpt2, Cost(profile=moded, durations=np.zeros(len(gpt2.ops)), priced_host=True), hooks=False).run(plan, NO_LIMIT)
    assert interpreted.level == "interpreted"
    assert interpreted.breakdown["host_s"] == pytest.approx(events * 1e-6 + len(gpt2.ops) * 2e-6)
    # the interpreted runner checks every op's arguments while a storage is away: each such op pays the guard
    away = set()
    for d in plan.decisions:
        away.update(range(d.out_after + 1, d.back_before) if d.back_before > d.out_after else
                    [*range(d.out_after + 1, len(gpt2.ops)), *range(d.back_before)])
    guarding = dataclasses.replace(moded, guard_op_s=3e-6)
    checked = Simulator(gpt2, Cost(profile=guarding, durations=np.zeros(len(gpt2.ops)), priced_host=True),
                        hooks=False).run(plan, NO_LIMIT)
    assert away and checked.breakdown["host_s"] == pytest.approx(interpreted.breakdown["host_s"] + len(away) * 3e-6)


def test_only_a_traced_pytorch_step_pays_the_host(gpt2):
    assert Cost.for_trace(gpt2, "h100").priced_host
    imported = dataclasses.replace(gpt2, meta={**gpt2.meta, "source": "dtr-log"})
    assert Cost.for_trace(imported, "h100").host_op_s == 0.0 and not Cost.for_trace(imported, "h100").priced_host


def test_op_times_measured_on_the_cpu_hold_the_host_already(gpt2):
    timed = dataclasses.replace(gpt2, meta={**gpt2.meta, "time_repeats": 3},
                                ops=tuple(dataclasses.replace(op, duration_s=1e-6) for op in gpt2.ops))
    assert Cost.for_trace(timed, "h100").host_op_s == 0.0 and Cost.for_trace(gpt2, "h100").host_op_s > 0


def test_a_trace_keeps_its_hook_records_on_disk_and_older_files_read(gpt2, tmp_path):
    memplan.write_trace(gpt2, tmp_path / "t.jsonl")
    again = memplan.read_trace(tmp_path / "t.jsonl")
    assert again.saved == gpt2.saved and again.calls == gpt2.calls and again.digest == gpt2.digest
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert again.marks == gpt2.marks and gpt2.marks
    header = lines[0].replace('"version": 4', '"version": 2')
    old = [header] + [line for line in lines[1:] if not any(f'"type": "{kind}"' in line for kind in ("saved", "call", "mark"))]
    (tmp_path / "old.jsonl").write_text("\n".join(old).replace(f'"saved": {len(gpt2.saved)}', '"saved": 0')
                                        .replace(f'"calls": {len(gpt2.calls)}', '"calls": 0')
                                        .replace(f'"marks": {len(gpt2.marks)}', '"marks": 0') + "\n")
    older = memplan.read_trace(tmp_path / "old.jsonl")
    assert older.saved == () and older.ops == gpt2.ops
    assert Simulator(older, Problem.of(older).cost).lower(memplan.plan(gpt2, "85%", planner="dtr").decisions).level \
        == "interpreted"


def _unhookable_swaps(trace):
    """Swaps no hook can run: of a storage no owner holds, which autograd does not save or which is
    away until an op outside backward (no unpack guards it)."""
    sites, owned = HookSites(trace), {o.storage for o in trace.owners}
    for s in trace.storages:
        acc = sorted(set(trace.accesses[s.id]))
        for a, b in zip(acc, acc[1:]):
            d = memplan.Decision(storage=s.id, action="swap", out_after=a, back_before=b)
            if s.id not in owned and b - a > 1 and sites.reason(d):
                yield d


def test_the_validator_keeps_resident_what_no_hook_runs_at_the_hooked_level(gpt2):
    # one rule (memplan.model.hooksites) for simulator and validator: a plan fixed at the hooked level keeps
    # an unhookable swap's storage resident, so a budget only that swap met is broken there, and only there
    from memplan.sim.validate import static_load

    for d in _unhookable_swaps(gpt2):
        budget = int(static_load(gpt2, [d]).max())
        if budget < gpt2.peak_load_bytes:
            break
    assert budget < gpt2.peak_load_bytes and f"swap of storage {d.storage}" in HookSites(gpt2).reason(d)
    plan = Plan(decisions=(d,), budget_bytes=budget, trace_digest=gpt2.digest)
    assert validate(gpt2, plan) == [] and validate(gpt2, plan.with_meta(level="interpreted")) == []
    assert [x.kind for x in validate(gpt2, plan.with_meta(level="hooked"))] == [OVER_BUDGET]
    hooked = Simulator(gpt2, Problem.of(gpt2).cost).hooked(plan, budget)
    assert hooked.dropped == 1 and not hooked.feasible  # the simulator's hooked form agrees

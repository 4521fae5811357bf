"""vDNN and vDNN++ (paper 001): the layer rules, Fig. 4's stall, exact execution, compression."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from memplan.cost.model import Cost
from memplan.cost.profiles import get_profile
from memplan.errors import InfeasibleBudgetError
from memplan.exec.engine import ThreadCopyEngine
from memplan.planners.base import plan as make_plan
from memplan.planners.vdnn import offloads
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import _Builder
from memplan.tracing.io import write_trace
from memplan.workflows.optimize import optimize, trace_step

from tests.exec.helpers import tiny_workload
from tests.user_errors import one_line_error

MS = 1e-3
COPY_BYTES = 62_000_000  # Table I: one layer input takes 62 ms over the link
LINK = 1e9  # bytes/s: 62 MB in 62 ms


NO_HOST = {"host_op_s": 0.0, "hook_s": 0.0, "hook_call_s": 0.0, "mode_op_s": 0.0, "replay_op_s": 0.0, "action_s": 0.0}


def fig4_network():
    """Table I's timings on three layers: conv (80 ms), pool (3 ms), conv (80 ms), then backward.

    Returns (trace, cost). Inputs of the pool (a0) and of the second conv (a1) are offloaded
    under `all`; only a1 (a conv's input) under `conv`.
    """
    b = _Builder()
    x = b.storage("x", COPY_BYTES, "input", pre=True)
    a0, a1, a2 = (b.storage(f"a{i}", COPY_BYTES, "activation") for i in range(3))
    g, g1, g0 = (b.storage(name, COPY_BYTES, "temp") for name in ("g", "g1", "g0"))
    dw = b.storage("dw", 4, "grad")
    b.op("aten.convolution", "forward", "l0", reads=[x], writes=[a0], flops=0)
    b.op("aten.max_pool2d_with_indices", "forward", "l1", reads=[a0], writes=[a1], flops=0)
    b.op("aten.convolution", "forward", "l2", reads=[a1], writes=[a2], flops=0)
    b.op("aten.mse_loss_backward", "backward", "loss", reads=[a2], writes=[g], flops=0)
    b.op("aten.convolution_backward", "backward", "l2", reads=[g, a1], writes=[g1], flops=0)
    b.op("aten.max_pool2d_with_indices_backward", "backward", "l1", reads=[g1, a0], writes=[g0], flops=0)
    b.op("aten.convolution_backward", "backward", "l0", reads=[g0, x], writes=[dw], flops=0)
    trace = b.build(meta={"model": "fig4"})
    # the figure's timings are the device's alone: no host work per op or action
    profile = dataclasses.replace(get_profile("gtx1080ti"), copy_latency_s=0.0, link_efficiency=1.0,
                                  d2h_bytes_per_s=LINK, h2d_bytes_per_s=LINK, **NO_HOST)
    durations = np.array([80, 3, 80, 120, 160, 6, 160]) * MS
    return trace, Cost(profile=profile, durations=durations)


@pytest.fixture(scope="module")
def conv_trace():
    w = tiny_workload()
    return trace_step(w.step, w.inputs, w.model, w.optimizer)


def test_the_layer_rules_choose_inputs_of_all_conv_and_alternate_conv_layers():
    trace, _ = fig4_network()
    names = {mode: [trace.storages[o.storage].name for o in offloads(trace, mode)] for mode in ("all", "conv", "aconv")}
    assert names == {"all": ["a0", "a1"], "conv": ["a1"], "aconv": ["a1"]}


def test_vdnn_stalls_as_in_fig4_and_vdnn_plus_plus_does_not():
    """By hand: the pool runs 80-83 ms while a0's offload runs 80-142 ms (it starts with the
    pool, which only reads a0); vDNN waits for it (59 ms), then conv l2 runs 142-222 ms and
    covers a1's offload (142-204 ms). vDNN++ starts l2 at 83 ms; a1's copy queues behind a0's
    (142-204 ms), lands back before l2's backward needs it, and nothing ever waits."""
    trace, cost = fig4_network()
    compute = float(cost.durations.sum())
    sync = make_plan(trace, None, planner="vdnn:all", cost=cost).predicted
    asyn = make_plan(trace, None, planner="vdnn++:all", cost=cost).predicted
    assert sync["breakdown"]["sync_stall_s"] == pytest.approx(59 * MS, abs=1e-9)
    assert sync["time_s"] == pytest.approx(compute + 59 * MS, abs=1e-9)
    assert asyn["time_s"] == pytest.approx(compute, abs=1e-9)
    stalls = asyn["breakdown"]
    assert stalls["sync_stall_s"] == stalls["prefetch_stall_s"] == stalls["memory_stall_s"] == 0.0


def test_vdnn_plus_plus_waits_for_memory_only_when_the_budget_needs_the_offload():
    trace, cost = fig4_network()
    vdnn = make_plan(trace, None, planner="vdnn:all", cost=cost)
    peak = vdnn.predicted["peak_load_bytes"]
    tight = make_plan(trace, peak, planner="vdnn++:all", cost=cost)
    assert not validate(trace, tight)
    assert tight.predicted["peak_load_bytes"] <= peak
    assert tight.predicted["time_s"] <= vdnn.predicted["time_s"] + 1e-12


def test_a_mode_under_its_smallest_budget_names_the_budget_it_fits():
    trace, cost = fig4_network()
    with pytest.raises(InfeasibleBudgetError) as exc:
        make_plan(trace, 2 * COPY_BYTES, planner="vdnn++:conv", cost=cost)
    fits = make_plan(trace, exc.value.min_feasible_bytes, planner="vdnn++:conv", cost=cost)
    assert fits.predicted["peak_load_bytes"] <= exc.value.min_feasible_bytes
    with pytest.raises(InfeasibleBudgetError):
        make_plan(trace, exc.value.min_feasible_bytes - 1, planner="vdnn++:conv", cost=cost)


def test_dyn_takes_the_fastest_mode_that_fits(conv_trace):
    trace, cost = conv_trace, Cost.for_trace(conv_trace, "gtx1080ti")
    roomy = make_plan(trace, None, planner="vdnn++:dyn", cost=cost)
    assert roomy.report["mode"] == "none" and not roomy.decisions
    with pytest.raises(InfeasibleBudgetError) as exc:
        make_plan(trace, 1, planner="vdnn++:all", cost=cost)
    budget = exc.value.min_feasible_bytes  # all fits it, keeping everything does not
    assert budget < trace.peak_load_bytes
    tight = make_plan(trace, budget, planner="vdnn++:dyn", cost=cost)
    assert tight.report["mode"] != "none"
    for mode in ("all", "conv", "aconv"):
        try:
            fixed = make_plan(trace, budget, planner=f"vdnn++:{mode}", cost=cost)
        except InfeasibleBudgetError:
            continue
        assert tight.predicted["time_s"] <= fixed.predicted["time_s"] + 1e-12


def test_memory_optimal_algorithms_take_no_workspace_and_performance_optimal_are_faster(conv_trace):
    m = make_plan(conv_trace, None, planner="vdnn:conv", profile="gtx1080ti", algo="m")
    p = make_plan(conv_trace, None, planner="vdnn:conv", profile="gtx1080ti", algo="p")
    assert m.microbatches and all(mb.workspace_bytes == 0 for mb in m.microbatches)
    assert sum(mb.time_s for mb in p.microbatches) < sum(mb.time_s for mb in m.microbatches)
    assert [d.storage for d in m.decisions] == [d.storage for d in p.decisions]


def test_compressed_offloads_move_fewer_bytes(conv_trace):
    plain = make_plan(conv_trace, None, planner="vdnn++:all")
    packed = make_plan(conv_trace, None, planner="vdnn++:all", compress=0.4)
    assert packed.decisions and all(d.compress_ratio == 0.4 for d in packed.decisions)
    assert packed.predicted["link_bytes"] < plain.predicted["link_bytes"]


@pytest.mark.parametrize("order", ["prefetch-first", "derivative-first"])
def test_the_high_end_variant_lays_offloaded_inputs_out_above_the_rest(conv_trace, order):
    plan = make_plan(conv_trace, None, planner="vdnn++:all+highend", order=order)
    assert plan.decisions and plan.pool_bytes >= plan.predicted["peak_load_bytes"]
    assert validate(conv_trace, plan) == []
    offloaded = {d.storage for d in plan.decisions}
    first_slot = {}
    for slot in sorted(plan.pool, key=lambda s: s.start):
        first_slot.setdefault(slot.storage, slot.offset)
    # where forward puts them: offloaded inputs from the top down, everything else best-fit from the bottom
    high = np.mean([first_slot[s] for s in offloaded])
    low = np.mean([off for s, off in first_slot.items()
                   if s not in offloaded and conv_trace.storages[s].kind == "activation"])
    assert high > low


# --- execution ---------------------------------------------------------------------------------

STEPS = 2


def _train(plan=None, engine=None, trace=None):
    w = tiny_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace) \
        if plan is not None else w.step
    if engine is not None:
        step.runtime.engine.close()
        step.runtime.engine = step.runtime.runner.engine = engine
    torch.manual_seed(3)
    for i in range(STEPS):
        step(*w.make_inputs(w.batch, seed=50 + i))
    stats = step.stats() if plan is not None else None
    if plan is not None:
        step.close()
    return w.model.state_dict(), stats


@pytest.mark.parametrize("name, params", [("vdnn:all", {}), ("vdnn:conv", {}), ("vdnn:aconv", {}),
                                          ("vdnn++:all", {}), ("vdnn++:conv", {"compress": 0.5}),
                                          ("vdnn++:aconv", {}), ("vdnn:dyn", {"algo": "m"}),
                                          ("vdnn++:dyn", {"algo": "m"})])
def test_every_mode_trains_exactly_like_plain_training(conv_trace, name, params):
    budget = None if "dyn" not in name else make_plan(conv_trace, None, planner=name.replace("dyn", "all"),
                                                      algo="m").predicted["peak_load_bytes"]
    plan = make_plan(conv_trace, budget, planner=name, **params)
    assert plan.decisions
    expected, _ = _train()
    got, stats = _train(plan, trace=conv_trace)
    assert stats["diverged_steps"] == 0 and stats["released"] == STEPS * len(plan.decisions)
    beside = sum(d.overlap and d.compress_ratio is None for d in plan.decisions)  # copies started with their op
    assert (beside > 0 or "compress" in params) and stats["copied_beside"] == STEPS * beside
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


class _LoggingEngine(ThreadCopyEngine):
    """A CPU copy lane that lags `delay_s` per offload and logs when each is issued and done."""

    def __init__(self, events: list, delay_s: float):
        super().__init__(before_job=lambda lane: time.sleep(delay_s) if lane == "d2h" else None)
        self.events, self.lock = events, threading.Lock()

    def log(self, event):
        with self.lock:
            self.events.append(event)

    def submit(self, lane, fn, *, after=None):
        if lane != "d2h":
            return super().submit(lane, fn, after=after)
        self.log("issued")

        def logged():
            fn()
            self.log("copied")
        return super().submit(lane, logged, after=after)


def _layer_starts_during_offloads(planner: str, conv_trace, delay_s: float) -> tuple[int, int]:
    """Run one step with a lagging copy lane; (offloads, layer starts seen while one was in flight)."""
    plan = make_plan(conv_trace, None, planner=planner)
    w = tiny_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=conv_trace)
    events: list = []
    engine = _LoggingEngine(events, delay_s)
    step.runtime.engine.close()
    step.runtime.engine = step.runtime.runner.engine = engine
    for name, module in w.model.named_modules():
        if not list(module.children()):
            module.register_forward_pre_hook(lambda m, args, name=name: engine.log(("starts", name)))
    step(*w.make_inputs(w.batch, seed=7))
    step.close()
    in_flight, overlapped = 0, 0
    for event in events:
        in_flight += {"issued": 1, "copied": -1}.get(event, 0)
        overlapped += event not in ("issued", "copied") and in_flight > 0
    assert events.count("issued") == events.count("copied") == len(plan.decisions)
    return len(plan.decisions), overlapped


def test_the_synchronous_mode_waits_for_each_offload_before_the_next_layer_starts(conv_trace):
    offloaded, overlapped = _layer_starts_during_offloads("vdnn:all", conv_trace, delay_s=0.03)
    assert offloaded > 0 and overlapped == 0


def test_the_asynchronous_mode_starts_the_next_layer_during_an_offload(conv_trace):
    """The control of the test above: the same lagging lane, no per-layer synchronisation."""
    offloaded, overlapped = _layer_starts_during_offloads("vdnn++:all", conv_trace, delay_s=0.1)
    assert offloaded > 0 and overlapped > 0


# --- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def fig4_file(tmp_path):
    path = tmp_path / "fig4.jsonl"
    write_trace(fig4_network()[0], path)
    return path


@pytest.mark.parametrize("planner, params, says", [
    ("vdnn:bogus", [], "vdnn:bogus"),
    ("vdnn++:all", ["algo=x"], "algo"),
    ("vdnn:conv", ["compress=2"], "compress"),
    ("vdnn:all", ["threads=2"], "threads"),
    ("vdnn++:all+highend", ["order=sideways"], "sideways"),
])
def test_a_bad_mode_or_parameter_is_one_error_line(capsys, tmp_path, fig4_file, planner, params, says):
    out = tmp_path / "p.json"
    argv = ["plan", fig4_file, "--planner", planner, "--budget", "100%", "-o", out]
    line = one_line_error(capsys, argv + (["--param", *params] if params else []))
    assert says in line
    assert not out.exists()


# --- host compression (§IV-C) ---------------------------------------------------------------------


def _hostzvc():
    """benchmarks/hostzvc.py, the host-side compression benchmarks/vdnn.py measures (not the executor's)."""
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module("hostzvc")
    finally:
        sys.path.remove(bench)


@pytest.mark.parametrize("threads", [1, 3])
def test_host_zero_value_compression_round_trips_bit_exactly(threads):
    hostzvc = _hostzvc()
    rng = np.random.default_rng(0)
    a = np.maximum(rng.standard_normal((5, 7, 11)).astype(np.float32), 0)  # ReLU output
    a[0, 0, :3] = [-0.0, np.nan, np.float32(1e-45)]
    c = hostzvc.compress(a, threads=threads)
    assert len(c.parts) == threads
    out = hostzvc.decompress(c, threads=threads)
    assert out.dtype == a.dtype and out.shape == a.shape
    assert np.array_equal(out.view(np.uint32), a.view(np.uint32))
    nnz = int(np.count_nonzero(a.view(np.uint32)))
    assert c.nbytes == sum((p.numel + 7) // 8 for p in c.parts) + 4 * nnz
    assert hostzvc.density(a) == nnz / a.size


# --- conformance ---------------------------------------------------------------------------------


class TestVdnnAllConformance(PlannerConformance):
    planner = "vdnn:all"


class TestVdnnPlusPlusConvConformance(PlannerConformance):
    planner = "vdnn++:conv"
    params = {"algo": "p"}


class TestVdnnPlusPlusDynConformance(PlannerConformance):
    planner = "vdnn++:dyn"


class TestVdnnPlusPlusHighEndConformance(PlannerConformance):
    planner = "vdnn++:aconv+highend"
    params = {"order": "derivative-first"}
    must_fit = ()  # the CNMeM-like pool fragments above the peak

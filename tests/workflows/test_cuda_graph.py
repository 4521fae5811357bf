"""Capturing the planned step as a CUDA graph (issue 35), as far as the CPU allows: the capturability
check over real CPU traces, the capture schedule derived from the step program, the simulator's price
of a replay, the recovery after a failed capture, and the `cuda_graph` option's errors and report.
The capture itself runs in tests/workflows/test_cuda_graph_gpu.py (skipped without CUDA)."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from torch import nn

from memplan.cli import main
from memplan.cost.model import Cost
from memplan.errors import MemplanError
from memplan.exec.capturable import CaptureCheck, check_optimizer, check_step, input_change
from memplan.exec.engine import InlineCopyEngine
from memplan.exec.graph_schedule import LAYOUT, PRIVATE, capture_schedule
from memplan.exec.graphed import _backup, _recover
from memplan.exec.runtime import PlanRuntime
from memplan.exec.slab import align_up
from memplan.model import Decision, Plan
from memplan.model.program import ActionKind
from memplan.problem import Problem
from memplan.sim.program import compile_program
from memplan.sim.replayed import HOST_COSTS, replay_cost, replay_time_s
from memplan.sim.stage import simulate
from memplan.workflows.cuda_graph import PREFIX, CudaGraphs, changed_inputs
from memplan.workflows.optimize import optimize, trace_step
from memplan.workflows.step_trace import input_signature

from tests.exec.helpers import recompute_plan, swap_all_plan, tiny_workload, train_step_of


class Gate(nn.Module):
    """A leaf module that does `what` to its input inside its forward (so the op has a module)."""

    def __init__(self, what):
        super().__init__()
        self.what = what

    def forward(self, h):
        self.what(h)
        return h


def _traced(what):
    """The trace of a small MLP step whose module `gate` does `what`, and the step's optimizer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Gate(what), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    return trace_step(train_step_of(model, opt), (x, y), model, opt), opt


def _only(trace, name: str) -> int:
    """The index of the one op of `trace` named `name` (the oracle: a scan of the trace)."""
    found = [op.index for op in trace.ops if op.name == name]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("what,name,cause", [
    (lambda h: h.sum().item(), "aten._local_scalar_dense.default", ".item()"),
    (lambda h: torch.nonzero(h > 0), "aten.nonzero.default", "depends on the data"),
    (lambda h: torch.unique(h), "aten._unique2.default", "depends on the data"),
    (lambda h: torch.masked_select(h, h > 0), "aten.masked_select.default", "depends on the data"),
    (lambda h: torch.repeat_interleave(torch.tensor([1, 2])), "aten.repeat_interleave.Tensor", "output_size"),
])
def test_a_host_sync_or_data_shaped_op_is_refused_with_its_op_and_module(what, name, cause):
    trace, opt = _traced(what)
    check = check_step(trace, optimizer=opt, device="cpu")
    assert not check.capturable and len(check.refusals) == 1
    refusal = check.refusals[0]
    assert refusal.op == _only(trace, name)
    assert refusal.line().startswith(f"op {refusal.op} {name} (forward, module 1): ") and cause in refusal.line()
    assert check.reason == refusal.line() and "\n" not in check.reason


def test_a_clean_step_is_capturable():
    w = tiny_workload()  # convolutions, batch norm, in-place ReLU, dropout, SGD with momentum
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    program = compile_program(Problem.of(trace), swap_all_plan(trace))
    check = check_step(trace, program, optimizer=w.optimizer, device="cuda",
                       signature=tuple((s, d, "cuda") for s, d, _ in input_signature(w.inputs)))
    assert check.capturable and check.reason == "" and check.to_json()["refusals"] == []


def test_a_grad_scaler_is_named_before_the_value_it_reads():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")

    def step(x, y):
        opt.zero_grad()
        scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()

    trace = trace_step(step, (torch.randn(4, 4), torch.randint(0, 3, (4,))), model, opt)
    check = check_step(trace, optimizer=opt, device="cpu")
    unscale = _only(trace, "aten._amp_foreach_non_finite_check_and_unscale_.default")
    assert check.refusals[0].op == unscale and "a GradScaler" in check.reason
    assert check.reason.endswith(f"(and {len(check.refusals) - 1} more)")


class OwnOptimizer(torch.optim.Optimizer):
    """An optimizer memplan does not know."""

    def __init__(self, params):
        super().__init__(params, {})


@pytest.mark.parametrize("make,cause", [
    (lambda p: torch.optim.Adam(p), "the optimizer Adam: keeps its step count on the host; build it with capturable=True"),
    (lambda p: torch.optim.AdamW(p, capturable=True), None),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), None),
    (lambda p: torch.optim.Adagrad(p), "the optimizer Adagrad: has no capturable mode"),
    (lambda p: OwnOptimizer(p), "the optimizer OwnOptimizer: is not known to be capturable"),
])
def test_an_optimizer_is_refused_unless_its_state_lives_on_the_device(make, cause):
    refusals = check_optimizer(make(nn.Linear(2, 2).parameters()))
    if cause is None:
        assert refusals == []
    else:
        assert len(refusals) == 1 and refusals[0].line().startswith(cause)


def test_inputs_on_the_cpu_of_a_gpu_step_and_compressed_swaps_are_refused():
    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    program = compile_program(Problem.of(trace), swap_all_plan(trace, compress=0.5), hooks=False)
    lines = [r.line() for r in check_step(trace, program, signature=input_signature(w.inputs), device="cuda").refusals]
    assert lines[0].startswith("input 0 (shape (2, 3, 8, 8) float32 on cpu): is on the CPU")
    assert sum("zero-value compression" in line for line in lines) == len(program.decisions) > 0


def test_a_shape_change_is_refused_with_the_input_and_both_shapes(caplog):
    captured = input_signature((torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)))
    later = input_signature((torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)))
    assert input_change(captured, captured) is None
    line = input_change(captured, later).line()
    assert line == ("input 0: shape (5, 3) float32 on cpu where the graph was captured for shape (4, 3) float32 "
                    "on cpu (a graph replays fixed shapes)")
    # the option's path, without a GPU: a graph that would replay refuses the call
    auto = CudaGraphs("auto", torch.device("cuda"), CaptureCheck())
    with caplog.at_level(logging.WARNING, logger="memplan.workflows.cuda_graph"):
        changed_inputs(auto, captured, (torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)))
    assert PREFIX + line in caplog.text and auto.refused_calls == 1
    with pytest.raises(MemplanError, match="input 0: shape"):
        changed_inputs(CudaGraphs("on", torch.device("cuda"), CaptureCheck()), captured,
                       (torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)))


def test_a_loop_of_your_own_is_not_captured():
    auto = CudaGraphs("auto", torch.device("cuda"), CaptureCheck())
    auto.own_loop()
    assert not auto.active and "a training loop of your own runs eagerly" in auto.reason
    with pytest.raises(MemplanError, match="a training loop of your own"):
        CudaGraphs("on", torch.device("cuda"), CaptureCheck()).own_loop()
    cpu = CudaGraphs("auto", torch.device("cpu"), CaptureCheck())
    cpu.own_loop()
    assert "CPU" in cpu.reason


def test_a_step_that_cannot_be_captured_is_an_error_with_on_and_a_warning_with_auto(caplog):
    trace, opt = _traced(lambda h: h.sum().item())
    check = check_step(trace, optimizer=opt, device="cuda")
    with pytest.raises(MemplanError) as err:
        CudaGraphs("on", torch.device("cuda"), check)
    assert str(err.value) == PREFIX + check.reason
    with caplog.at_level(logging.WARNING, logger="memplan.workflows.cuda_graph"):
        auto = CudaGraphs("auto", torch.device("cuda"), check)
    assert not auto.active and auto.reason == check.reason
    assert caplog.text.count(PREFIX) == 1 and "the eager executor runs" in caplog.text


@pytest.fixture(scope="module")
def tiny():
    w = tiny_workload()
    return w, trace_step(w.step, w.inputs, w.model, w.optimizer)


def _most_host_bytes_at_once(trace, program) -> int:
    """The oracle's lower bound of the slab: the most aligned bytes of swapped storages away at once
    (each from its swap-out to its wait, in half-op time), by a sweep over the decisions."""
    edges = []
    for d in program.decisions:
        if d.action == "swap" and not d.wraps:
            nbytes = align_up(trace.storages[d.storage].nbytes)
            edges += [(2 * d.out_after + 1, nbytes), (2 * d.back_before + 1, -nbytes)]
    load, most = 0, 0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):  # at one instant a wait ends before a copy starts
        load += delta
        most = max(most, load)
    return most


def test_the_schedule_of_a_swap_plan(tiny):
    w, trace = tiny
    program = compile_program(Problem.of(trace), swap_all_plan(trace))
    schedule = capture_schedule(trace, program, input_signature(w.inputs))
    assert [(s.shape, s.dtype) for s in schedule.static_inputs] == [(tuple(t.shape), str(t.dtype)[6:]) for t in w.inputs]
    assert schedule.static_input_bytes == sum(t.numel() * t.element_size() for t in w.inputs)
    swaps = [k for k, d in enumerate(program.decisions) if d.action == "swap"]
    issued = {"d2h": ActionKind.SWAP_OUT, "h2d": ActionKind.PREFETCH}
    joined = {"d2h": ActionKind.RELEASE, "h2d": ActionKind.WAIT}
    for lane in ("d2h", "h2d"):
        events = [e for e in schedule.events if e.lane == lane]
        assert sorted(e.decision for e in events) == swaps  # one copy each way per swapped storage
        for e in events:
            assert program.actions[e.issued_by].kind == issued[lane] and program.actions[e.issued_by].decision == e.decision
            assert e.waited_by is not None and e.waited_by > e.issued_by
            assert program.actions[e.waited_by].kind == joined[lane] and program.actions[e.waited_by].decision == e.decision
            assert e.nbytes == trace.storages[e.storage].nbytes and e.storage == program.decisions[e.decision].storage
    most = _most_host_bytes_at_once(trace, program)
    assert 0 < most <= schedule.pinned_host_bytes <= sum(align_up(trace.storages[program.decisions[k].storage].nbytes)
                                                         for k in swaps)
    assert (schedule.pool, schedule.pool_bytes) == (PRIVATE, program.predicted.peak_load_bytes)
    laid_out = capture_schedule(trace, program, input_signature(w.inputs), layout_bytes=12345)
    assert (laid_out.pool, laid_out.pool_bytes) == (LAYOUT, 12345)
    assert json.loads(json.dumps(schedule.to_json()))["copies"] == {"d2h": len(swaps), "h2d": len(swaps)}


@pytest.mark.parametrize("hooks", [True, False])
def test_the_schedule_captures_each_recomputation_where_its_storage_is_made(tiny, hooks):
    w, trace = tiny
    program = compile_program(Problem.of(trace), recompute_plan(trace), hooks=hooks)
    assert program.level == ("hooked" if hooks else "interpreted")
    runs = capture_schedule(trace, program, input_signature(w.inputs)).recomputations
    recomputes = [i for i, a in enumerate(program.actions) if a.kind == ActionKind.RECOMPUTE]
    assert [r.action for r in runs] == recomputes and recomputes
    for r in runs:
        producer = trace.producer(r.storage)
        if hooks:  # a module call that holds the op that made the storage, run again from its start
            call = next(c for c in trace.calls if c.module == r.module and c.first_op <= producer < c.end_op)
            assert trace.ops[producer].module.startswith(call.module)
        elif r.ops:  # ops replayed, its producer among them (none: an earlier replay at that op made it)
            assert r.module == "" and producer in {j for st in program.rebuilds[r.decision].steps for j in st.ops}
    assert sum(r.ops for r in runs) > 0


def test_a_replay_is_priced_without_host_work(tiny):
    _, trace = tiny
    cost = Cost.for_trace(trace, "h100")
    replayed = replay_cost(cost)
    assert all(getattr(replayed.profile, name) == 0.0 for name in HOST_COSTS) and replayed.durations is cost.durations
    assert cost.profile.host_op_s > 0  # the eager step is host-bound on tiny ops
    assert replay_time_s(trace, None, cost) == pytest.approx(float(cost.durations.sum()), rel=1e-9)
    assert simulate(trace, None, cost=cost).time_s > 2 * replay_time_s(trace, None, cost)
    plan = swap_all_plan(trace)
    eager, graph = simulate(trace, plan, cost=cost), simulate(trace, plan, cost=replayed)
    assert graph.breakdown["host_s"] == 0.0 < eager.breakdown["host_s"] and graph.time_s < eager.time_s


class NothingRuns(InlineCopyEngine):
    """The copy lanes as a capture sees them: a copy is recorded, none runs."""

    def submit(self, lane, fn, *, after=None):
        return None


def _gap_plan(trace, kept_away: str, swapped: str) -> Plan:
    """Parameter `kept_away` on the host between steps, parameter `swapped` from its forward to its backward."""
    sid = {o.name: o.storage for o in trace.owners if o.kind == "param"}
    acc = trace.accesses
    first, last = acc[sid[kept_away]][0], acc[sid[swapped]]
    out = max(i for i in last if trace.ops[i].phase == "forward")
    back = min(i for i in last if trace.ops[i].phase == "backward")
    return Plan(decisions=(Decision(storage=sid[kept_away], action="swap", out_after=acc[sid[kept_away]][-1],
                                    back_before=first),
                           Decision(storage=sid[swapped], action="swap", out_after=out, back_before=back)),
                planner="test", trace_digest=trace.digest)


def test_a_failed_capture_puts_back_the_parameters_the_program_moves(tiny):
    """Rule 8 of memplan.exec.graphed: nothing a failed capture recorded ran, but what the program freed
    was freed. Emulated on the CPU: copies that never run, and the moved parameters' device bytes lost."""
    _, trace = tiny
    plan = _gap_plan(trace, "stem.0.weight", "head.weight")
    ref, w = tiny_workload(), tiny_workload()
    batches = [w.make_inputs(w.batch, seed=100 + i) for i in range(3)]
    torch.manual_seed(5)  # the same dropout masks on both sides
    for x in batches[:2]:
        ref.step(*x)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace, measure=False,
                    executor="interpreted")
    assert step.program.start_away and len(step.program.decisions) == 2
    torch.manual_seed(5)
    for x in batches[:2]:
        step(*x)
    runtime, moved = step.runtime, [w.model.stem[0].weight, w.model.head.weight]
    backup = _backup(runtime)

    def failing(x, y):  # the step as captured: its copies recorded, the moved bytes gone, then the capture fails
        w.optimizer.zero_grad()
        nn.functional.cross_entropy(w.model(x), y).backward()
        with torch.no_grad():
            for p in moved:
                p.fill_(float("nan"))
        raise RuntimeError("operation not permitted when stream is capturing")

    runtime.engine = runtime.runner.engine = NothingRuns()
    with pytest.raises(RuntimeError, match="capturing"), runtime.installed():
        runtime.begin_step(batches[2])
        failing(*batches[2])
    runtime.engine = runtime.runner.engine = InlineCopyEngine()
    _recover(runtime, backup)
    assert runtime.runner.entries[plan.decisions[0].storage].state == "away"  # settled again for the next step
    runtime.restore()
    for (name, p), q in zip(w.model.named_parameters(), ref.model.parameters()):
        assert torch.equal(p, q), name
    step.close()


def test_the_option_on_the_cpu(tmp_path, monkeypatch, capsys):
    w = tiny_workload()
    with pytest.raises(MemplanError, match="needs a CUDA device"):
        optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, cuda_graph="on")
    with pytest.raises(MemplanError, match="cuda_graph must be one of auto, on, off"):
        optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, cuda_graph="yes")
    default = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner="sqrt-n", budget="90%")
    assert default.stats()["cuda_graph"]["mode"] == "off"  # until a GPU run shows captures work
    default.close()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner="sqrt-n", budget="90%",
                    cuda_graph="auto")
    step(*w.inputs)
    graph = step.stats()["cuda_graph"]
    assert graph["mode"] == "auto" and not graph["captured"] and graph["capturable"]
    assert graph["reason"] == "the step runs on the CPU: a CUDA graph needs a CUDA device"
    assert graph["schedule"]["level"] == step.program.level and graph["schedule"]["predicted_replay_s"] > 0
    step.close()
    monkeypatch.chdir(tmp_path)
    assert main(["run", "kmeans", "--batch", "64", "--steps", "1", "--cuda-graph", "on"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "memplan: error: --cuda-graph on: the step runs on cpu: a CUDA graph needs --device cuda"
    assert main(["run", "kmeans", "--batch", "64", "--steps", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cuda_graph"]["mode"] == "off" and out["cuda_graph"]["reason"] == "cuda_graph is off"  # the default
    assert main(["run", "kmeans", "--batch", "64", "--steps", "1", "--json", "--cuda-graph", "auto"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cuda_graph"]["captured"] is False and "CPU" in out["cuda_graph"]["reason"]
    assert main(["run", "kmeans", "--batch", "64", "--steps", "1", "--baseline", "torch-checkpoint", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cuda_graph"] is None


class CpuGraphed:
    """GraphedStep's interface without CUDA: warm-up and "replay" run the eager step, the capture
    records its inputs' constants and fails with `failure` when given one."""

    failure = ""

    def __init__(self, run_step, runtime, device):
        self.run_step, self.runtime, self.graph, self.warmed, self.replays, self.constants = \
            run_step, runtime, None, 0, 0, []

    def warm_up(self, inputs):
        self.warmed += 1
        return self.run_step(inputs)

    def capture(self, inputs):
        from memplan.exec.graphed import constants_of

        if self.failure:
            return self.failure
        self.graph, self.constants = "captured", constants_of(inputs)
        return ""

    def replay(self, inputs):
        self.replays += 1
        return self.run_step(inputs)

    def release(self):
        self.graph = None

    def report(self):
        return {"warmup_steps": self.warmed, "replays": self.replays, "memory": {}}


def _scaled_step():
    """A tiny workload whose step takes a number beside its tensors."""
    w = tiny_workload()

    def step(x, y, scale):
        w.optimizer.zero_grad()
        (scale * nn.functional.cross_entropy(w.model(x), y)).backward()
        w.optimizer.step()

    return w, step


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_the_option_warms_up_captures_then_replays(monkeypatch, caplog, mode):
    """The option's sequence (memplan.workflows.cuda_graph), with the CUDA part stood in for."""
    from memplan.exec.graphed import WARMUP_STEPS
    from memplan.workflows import cuda_graph

    monkeypatch.setattr(cuda_graph, "GraphedStep", CpuGraphed)
    w, step_fn = _scaled_step()
    step = optimize(step_fn, *w.inputs, 1.0, model=w.model, optimizer=w.optimizer, planner="sqrt-n", budget="100%")
    step.graphs = CudaGraphs(mode, torch.device("cuda"), CaptureCheck())  # as on a GPU, where nothing is refused
    step(*w.make_inputs(w.batch, seed=99), 1.0)
    assert step.stats()["cuda_graph"]["reason"] == f"warming up: 1 of the {WARMUP_STEPS} eager steps before the capture ran"
    for i in range(WARMUP_STEPS + 2):
        step(*w.make_inputs(w.batch, seed=100 + i), 1.0)
    graph = step.stats()["cuda_graph"]
    assert graph["captured"] and graph["warmup_steps"] == WARMUP_STEPS and graph["replays"] == 3
    x = w.make_inputs(w.batch, seed=200)
    _refused(step, mode, lambda: step(*x, 2.0), "an input that is not a tensor: differs from the captured one", caplog)
    step.close()


def _refused(step, mode: str, call, match: str, caplog) -> None:
    """`call()` cannot be replayed: with "on" an error, with "auto" an eager step and one warning."""
    replays = step.graphs.graphed.replays
    if mode == "on":
        with pytest.raises(MemplanError, match=match):
            call()
        return
    with caplog.at_level(logging.WARNING, logger="memplan.workflows.cuda_graph"):
        call()  # eagerly: a graph replays the values it captured
    assert step.graphs.refused_calls == 1 and step.graphs.graphed.replays == replays
    assert re.search(match, caplog.text)


def test_a_failed_capture_is_a_warning_with_auto_then_eager_steps(monkeypatch, caplog):
    from memplan.exec.graphed import WARMUP_STEPS
    from memplan.workflows import cuda_graph

    monkeypatch.setattr(cuda_graph, "GraphedStep", CpuGraphed)
    monkeypatch.setattr(CpuGraphed, "failure", "the capture failed: RuntimeError: operation not permitted")
    w, step_fn = _scaled_step()
    step = optimize(step_fn, *w.inputs, 1.0, model=w.model, optimizer=w.optimizer)
    step.graphs = CudaGraphs("auto", torch.device("cuda"), CaptureCheck())
    with caplog.at_level(logging.WARNING, logger="memplan.workflows.cuda_graph"):
        for i in range(WARMUP_STEPS + 2):
            step(*w.make_inputs(w.batch, seed=100 + i), 1.0)
    graph = step.stats()["cuda_graph"]
    assert not graph["captured"] and graph["reason"] == CpuGraphed.failure and not step.graphs.active
    assert caplog.text.count(PREFIX + CpuGraphed.failure) == 1
    step.close()


def test_a_failed_capture_names_the_error_that_broke_it():
    """Ending a broken capture fails only "due to a previous error": the line names that previous one."""
    from memplan.exec.graphed import _first_error

    try:
        try:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture")
    except RuntimeError as exc:
        line = _first_error(exc)
    assert line == ("RuntimeError: operation not permitted when stream is capturing "
                    "(then RuntimeError: operation failed due to a previous error during capture)")
    assert _first_error(ValueError("alone")) == "ValueError: alone"


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_changed_learning_rate_is_not_replayed(monkeypatch, caplog, mode):
    """Finding 6: a graph replays the optimizer's hyper-parameters as it captured them (a float lr is a
    kernel argument): a scheduler's new learning rate would be ignored by every replay."""
    from memplan.exec.graphed import WARMUP_STEPS
    from memplan.workflows import cuda_graph

    monkeypatch.setattr(cuda_graph, "GraphedStep", CpuGraphed)
    w, step_fn = _scaled_step()
    step = optimize(step_fn, *w.inputs, 1.0, model=w.model, optimizer=w.optimizer, planner="sqrt-n", budget="100%")
    step.graphs = CudaGraphs(mode, torch.device("cuda"), CaptureCheck())
    scheduler = torch.optim.lr_scheduler.StepLR(w.optimizer, step_size=WARMUP_STEPS + 1, gamma=0.5)
    for i in range(WARMUP_STEPS + 1):  # warm-up, then the capture (and its replay)
        step(*w.make_inputs(w.batch, seed=100 + i), 1.0)
        scheduler.step()
    assert step.graphs.graphed.replays == 1 and w.optimizer.param_groups[0]["lr"] == 0.05
    x = w.make_inputs(w.batch, seed=200)
    _refused(step, mode, lambda: step(*x, 1.0), "the optimizer's lr of group 0: 0.05 where the graph captured 0.1 "
                                                "\\(a graph replays the values it captured: give the optimizer tensor", caplog)
    step.close()


@pytest.mark.parametrize("executor", ["auto", "interpreted"])
def test_recomputations_that_set_the_generator_are_refused_before_torch_2_10(tiny, executor):
    """Finding 9: a recomputation sets the CUDA generator's state back (a region run, a replayed random op),
    which a capture allows from torch 2.10 on, while memplan allows torch 2.4."""
    from memplan.exec.capturable import check_program

    _, trace = tiny
    program = compile_program(Problem.of(trace), recompute_plan(trace), hooks=executor == "auto")
    assert program.level == ("hooked" if executor == "auto" else "interpreted")
    refused = [r.line() for r in check_program(program, trace, torch_version="2.9.1+cu128")]
    assert refused == ["the plan's recomputations: set the CUDA generator's state back inside the capture, which "
                       "torch 2.9.1+cu128 does not allow (2.10 and later do)"]
    assert check_program(program, trace, torch_version="2.10.0") == []
    swaps = compile_program(Problem.of(trace), swap_all_plan(trace))
    assert check_program(swaps, trace, torch_version="2.9.1") == []

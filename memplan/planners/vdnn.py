"""vDNN and vDNN++ (paper 001): layer-wise offload of each chosen layer's input X.

Registered names: `vdnn:{all,conv,aconv,dyn}` and `vdnn++:{all,conv,aconv,dyn}`, each with
`algo=m` (memory-optimal convolution algorithms: no workspace) or `algo=p`
(performance-optimal: the fastest algorithm whatever its workspace), and
`vdnn++:{all,conv,aconv}+highend` (the plan's buffers laid out in one pool by paper 001's
non-offloaded high-end heuristic, allocator `vdnnpp-highend`, with `order=prefetch-first` or
`derivative-first`).

- Which layers offload (§II-B): `all` every layer, `conv` every convolution layer, `aconv`
  every other convolution layer (the first, third, ...). A layer's X is what it reads that
  an earlier layer made and backward reads again (a saved activation whose last forward
  reader is this layer); it leaves after that read and is back before its first backward use.
- Both start the offload with the layer's last forward op, beside it (`Decision.overlap`:
  that op only reads X). vDNN synchronises at the end of every layer: the compute stream
  waits for the offload (`Decision.sync`), Fig. 4's forward stall. vDNN++ (§IV-A) does not:
  the next layer starts at once and an allocation waits only when the budget needs the
  offloaded bytes (the simulator's lazy release).
- Both prefetch X of a layer when the backward layer before it starts (vDNN's "prefetch of
  layer n overlapped with layer m > n", m the next backward layer) and wait for it only at
  its use. With one layer of lead vDNN's wait at the end of layer m is the wait at layer
  n's start, so the two differ in forward only.
- `dyn`: the paper's profile passes: every fixed mode (and no offload) with both algorithm
  choices is simulated at the budget; the fastest that fits wins.
- `compress`: zero-value compression ratio for every offload (0 = off; §IV-C's host
  compression is measured by benchmarks/vdnn.py).

A fixed mode ignores the budget (the rule is the method); a budget it does not fit raises
the infeasible-budget error naming the smallest budget at which the simulator runs it.
"""

from __future__ import annotations

from ..conv.decide import decide
from ..cost.model import Cost
from ..errors import InfeasibleBudgetError, MemplanError
from ..model import Decision, Plan, Trace
from ..pool.api import with_pool
from ..problem import Problem
from ..sim.simulate import Simulator, simulator_of
from .base import infeasible, register
from .kit.fitting import smallest_fitting_budget
from .kit.ops import is_convolution
from .kit.prefetch import backward_layer_starts, in_issue_order, lead_trigger
from .kit.saved import SavedGap, saved_gaps

OFFLOAD_MODES = ("all", "conv", "aconv")  # fixed layer choices (§II-B); `dyn` picks among them
ALGOS = ("m", "p")  # memory-optimal or performance-optimal convolution algorithms
UNLIMITED_WORKSPACE = 1 << 50  # (p): the fastest algorithm, whatever its workspace


def offloads(trace: Trace, mode: str) -> list[SavedGap]:
    """The layer inputs X that `mode` ("all", "conv" or "aconv") offloads, in forward order: each
    leaves after its layer's last forward op reading it (its saved gap's `last_forward`)."""
    gaps = {g.storage: g for g in saved_gaps(trace)}
    out: list[tuple[SavedGap, bool]] = []  # (X, its layer is a convolution)
    for layer in trace.layers:
        if layer.phase != "forward":
            continue
        is_conv = any(is_convolution(trace.ops[j]) for j in layer.ops)
        out += [(gaps[sid], is_conv) for sid in layer.inputs if sid in gaps and gaps[sid].last_forward in layer.ops]
    if mode == "all":
        return [gap for gap, _ in out]
    convs = [gap for gap, is_conv in out if is_conv]
    if mode == "conv":
        return convs
    layers = sorted({g.last_forward for g in convs})  # one offloading op per conv layer
    kept = set(layers[::2])
    return [g for g in convs if g.last_forward in kept]


def mode_plan(trace: Trace, cost: Cost, mode: str, algo: str, *, sync: bool, compress: float = 0.0) -> Plan:
    """The plan of one fixed mode: offload decisions and convolution algorithms."""
    if mode not in OFFLOAD_MODES + ("none",):
        raise MemplanError(f"unknown vDNN offload mode {mode!r}; known: {', '.join(OFFLOAD_MODES)}, dyn")
    starts = backward_layer_starts(trace)
    chosen = offloads(trace, mode) if mode != "none" else []
    decisions = [Decision(storage=g.storage, action="swap", out_after=g.last_forward, back_before=g.back_before,
                          trigger=lead_trigger(starts, g.last_forward, g.back_before), sync=sync,
                          overlap=g.storage not in trace.ops[g.last_forward].writes, compress_ratio=compress or None)
                 for g in chosen]
    return Plan(decisions=in_issue_order(decisions), microbatches=conv_algorithms(trace, cost, algo))


def conv_algorithms(trace: Trace, cost: Cost, algo: str):
    """Undivided convolution kernels with memory-optimal (m) or performance-optimal (p) algorithms."""
    if algo not in ALGOS:
        raise MemplanError(f"unknown vDNN algorithm choice {algo!r}; known: m (memory-optimal), p (performance-optimal)")
    if not any(op.conv is not None for op in trace.ops):
        return ()
    workspace = 0 if algo == "m" else UNLIMITED_WORKSPACE
    return decide(trace, cost.profile, mode="wr", workspace=workspace, policy="undivided")


def fitted(trace: Trace, budget_bytes: int, cost: Cost, plan: Plan, name: str) -> tuple[Plan, float]:
    """`plan` and its simulated time if it fits `budget_bytes`; else the infeasible-budget error."""
    simulator = Simulator(trace, cost)
    result = simulator.run(plan, budget_bytes)
    if not result.feasible:
        raise infeasible(budget_bytes, smallest_fitting_budget(simulator, plan, budget_bytes), name)
    return plan, result.time_s


def dyn_plan(trace: Trace, budget_bytes: int, cost: Cost, *, sync: bool, compress: float, name: str,
             algos=ALGOS) -> Plan:
    """The fastest of every fixed mode and algorithm choice in `algos` (and no offload) that fits the budget."""
    best, lowest = None, None
    for mode in ("none",) + OFFLOAD_MODES:
        for algo in algos:
            candidate = mode_plan(trace, cost, mode, algo, sync=sync, compress=compress)
            try:
                plan, time_s = fitted(trace, budget_bytes, cost, candidate, name)
            except InfeasibleBudgetError as exc:
                lowest = exc.min_feasible_bytes if lowest is None else min(lowest, exc.min_feasible_bytes)
                continue
            if best is None or time_s < best[1]:
                best = (plan.with_meta(report={"mode": mode, "algo": algo}), time_s)
    if best is None:
        raise infeasible(budget_bytes, lowest, name)
    return best[0]


def _check(name: str, algo: str, compress: float) -> None:
    if not 0.0 <= compress <= 1.0:
        raise MemplanError(f"planner {name!r}: compress must be a ratio in [0, 1] (0 = off), got {compress}")
    if algo not in ALGOS + ("",):
        raise MemplanError(f"planner {name!r}: unknown algo {algo!r}; known: m (memory-optimal), "
                           f"p (performance-optimal)")


def _vdnn(problem: Problem, *, mode: str, sync: bool, name: str, algo: str, compress: float) -> Plan:
    _check(name, algo, compress)
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    if mode == "dyn":
        return dyn_plan(trace, budget_bytes, cost, sync=sync, compress=compress, name=name, algos=algo or ALGOS)
    algo = algo or "m"
    plan, _ = fitted(trace, budget_bytes, cost, mode_plan(trace, cost, mode, algo, sync=sync, compress=compress),
                     name)
    return plan.with_meta(report={"mode": mode, "algo": algo})


_WHAT = {"all": "offload of every layer's input", "conv": "offload of every convolution's input",
         "aconv": "offload of every other convolution's input", "dyn": "offload in the fastest mode that fits"}


def _register_family(family: str, sync: bool, what: str):
    def planner(problem: Problem, *, mode="all", sync=False, family="vdnn", algo: str = "",
                compress: float = 0.0) -> Plan:
        """Offload each chosen layer's input X after its forward (paper 001).

        Args:
            algo: "m" memory-optimal or "p" performance-optimal convolution algorithms;
                "" (default): "m" for a fixed mode, both for `dyn`, which tries them all.
            compress: zero-value compression ratio of every offload (0 = off).
        Raises:
            InfeasibleBudgetError: the mode does not fit the budget (names the smallest that fits).
            MemplanError: an unknown `algo`, or `compress` outside [0, 1].
        """
        return _vdnn(problem, mode=mode, sync=sync, name=f"{family}:{mode}", algo=algo, compress=compress)

    for mode in OFFLOAD_MODES + ("dyn",):
        planner = register(f"{family}:{mode}", f"{what} {_WHAT[mode]} (paper 001)",
                           decides=("swap", "microbatch"), mode=mode, sync=sync, family=family)(planner)
    return planner


vdnn_planner = _register_family("vdnn", True, "vDNN: synchronous")
vdnnpp_planner = _register_family("vdnn++", False, "vDNN++: asynchronous")


def _highend(problem: Problem, *, mode="all", algo: str = "m", compress: float = 0.0,
             order: str = "prefetch-first") -> Plan:
    """vDNN++ with its buffers in one pool: offloaded inputs at the high end, the rest best-fit (§IV-B).

    Args:
        algo, compress: as for `vdnn++:<mode>` ((p) workspaces are held outside the pool).
        order: at one step, allocate prefetched inputs before ("prefetch-first") or after
            ("derivative-first") the gradients.
    Raises:
        InfeasibleBudgetError: the offload plan or its pool does not fit; names a budget at
            which both do.
    """
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    name = f"vdnn++:{mode}+highend"
    _check(name, algo, compress)
    swaps = mode_plan(trace, cost, mode, algo or "m", sync=False, compress=compress)
    pooled = _pool(trace, swaps, cost, order)
    simulator = simulator_of(problem)
    fits = simulator.run(pooled, budget_bytes).feasible and pooled.pool_bytes <= budget_bytes
    if not fits:
        raise infeasible(budget_bytes, smallest_fitting_budget(simulator, pooled, max(pooled.pool_bytes,
                                                                                      budget_bytes + 1)), name)
    return pooled.with_meta(report={"mode": mode, "algo": algo or "m", "order": order})


def _pool(trace: Trace, plan: Plan, cost: Cost, order: str) -> Plan:
    return with_pool(trace, plan, allocator="vdnnpp-highend", cost=cost, order=order)


for _mode in OFFLOAD_MODES:
    register(f"vdnn++:{_mode}+highend", f"vDNN++ {_mode} with the high-end pool heuristic (paper 001 §IV-B)",
             decides=("swap", "microbatch", "pool"), mode=_mode)(_highend)

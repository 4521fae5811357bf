"""SuperNeurons (Wang et al. 2018) as two papers ran it: HOME's reading and paper 002's three modes.

`superneurons`, as HOME describes it (paper 004 §4.1): one fixed action per layer type.
"It only swaps the tensors of convolution layers and only recomputes the tensors in pool,
activation, local response normalization, and batch normalization layers": a feature map
(memplan.planners.kit.featuremaps) is swapped when a convolution made it, recomputed when the
last forward op that wrote it is a pooling, activation or normalisation op (a batch norm's
output that an in-place ReLU then overwrites is the ReLU's feature map), and kept otherwise
(fully connected, attention, element-wise sums, dropout). Swaps are prefetched one backward
layer ahead, recomputations follow the shared rules (a convolution output that a
recomputation reads is fetched back for it). The rules ignore the budget; with a budget at
or above the unconstrained peak nothing moves. A plan the simulator cannot run under the
budget raises the infeasible-budget error naming the smallest budget it fits.

`superneurons-modes:*`, as paper 002 ran them for its Fig. 5. SuperNeurons keeps the outputs
of expensive layers (convolutions, matrix products) as checkpoints and recomputes the cheap
layers after them (pooling, activation, batch norm) from the nearest checkpoint, and its
tensor cache offloads convolution outputs to the host. Paper 002 takes one point per mode:

- `superneurons-modes:recompute`: every saved activation made by a cheap op is dropped
  and recomputed before its first backward use (chains rebuild from the checkpoints);
- `superneurons-modes:swap`: every saved activation made by an expensive op is swapped
  (the cache under full memory pressure), prefetched in the order of paper 002 §4.5;
- `superneurons-modes:both`: the two together.

The plans ignore the budget; each raises `infeasible(...)` naming the smallest budget its
plan runs in. A recomputation that could not run (an input overwritten in place, or only
on the host) is left out.
"""

from __future__ import annotations

import numpy as np

from ..model import Action, Plan, Trace
from ..problem import Problem
from ..sim.simulate import Simulator
from .base import infeasible, register
from .kit.featuremaps import DEFAULT_MIN_BYTES, FeatureMaps, feature_maps
from .kit.fitting import smallest_fitting_budget
from .kit.ledger import Ledger
from .kit.ops import CONV_OPS, aten_name
from .kit.policy import INFEASIBLE, PolicyEvaluator
from .kit.prefetch import DEFAULT_LEAD, gap_decisions
from .kit.saved import saved_gaps

RECOMPUTED_OPS = frozenset({
    # pooling
    "max_pool2d_with_indices", "max_pool2d", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
    # activations
    "relu", "relu_", "threshold", "threshold_", "gelu", "sigmoid", "sigmoid_", "tanh", "tanh_", "silu", "silu_",
    "hardtanh", "hardtanh_", "leaky_relu", "leaky_relu_", "elu", "elu_", "softplus", "hardswish", "hardswish_",
    # batch and local response normalisation
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "cudnn_batch_norm", "batch_norm", "local_response_norm"})


def layer_policy(fm: FeatureMaps) -> np.ndarray:
    """SuperNeurons' action for every feature map, from the op that last wrote it in forward."""
    trace = fm.trace
    policy = np.full(len(fm), Action.KEEP, dtype=np.int8)
    for k, sid in enumerate(fm.storage):
        writer = max(j for j in trace.writers[int(sid)] if trace.ops[j].phase == "forward")
        op = trace.ops[writer]
        base = aten_name(op)
        if base in CONV_OPS:
            policy[k] = Action.SWAP
        elif (base in RECOMPUTED_OPS or "pool" in op.module.rsplit(".", 1)[-1]) and fm.recomputable[k]:
            policy[k] = Action.RECOMPUTE
    return policy


@register("superneurons", "SuperNeurons as HOME §4.1 describes it: swap conv outputs, recompute pool/activation/BN",
          decides=("swap", "recompute"))
def superneurons(problem: Problem, *, min_bytes: int = DEFAULT_MIN_BYTES, lead: int = DEFAULT_LEAD) -> Plan:
    """Swap convolution outputs, recompute pooling, activation and normalisation outputs.

    Args:
        problem: the trace, its cap and its costs (memplan.problem; no randomness here).
        min_bytes: smaller activations are not feature maps (they stay).
        lead: a prefetch is issued this many backward layers before the layer that needs it.
    Raises:
        InfeasibleBudgetError: the plan does not fit the budget (names its peak load).
    """
    trace, budget_bytes, cost, seed = problem.parts()
    if budget_bytes >= trace.peak_load_bytes:
        return Plan()
    fm = feature_maps(trace, min_bytes)
    evaluator = PolicyEvaluator(fm, cost, budget_bytes, lead)
    policy = layer_policy(fm)
    if evaluator(policy) >= INFEASIBLE:
        raise infeasible(budget_bytes, evaluator.smallest_cap(policy), "superneurons")
    return evaluator.plan(policy)


# --- paper 002's three modes ------------------------------------------------------------------

MODES = ("recompute", "swap", "both")
EXPENSIVE = ("convolution", "mm", "linear", "rnn", "lstm", "gru", "attention")  # names of checkpointed ops


def plan_superneurons_modes(problem: Problem, *, mode: str = "both",
                            min_bytes: int = 0) -> Plan:
    """Recompute cheap saved activations, swap expensive ones, or both (see the module doc).

    Args:
        mode: "recompute", "swap" or "both".
        min_bytes: smallest activation considered.
    """
    trace, budget_bytes, cost, seed = problem.parts()
    gaps = saved_gaps(trace, min_bytes)
    ledger = Ledger(trace, gaps, trace.peak_load_bytes)
    expensive = [_expensive(trace, g.storage) for g in gaps]
    for k in sorted(range(len(gaps)), key=lambda k: gaps[k].last_forward):
        if not expensive[k] and mode in ("recompute", "both"):
            effect = ledger.removal(k, gaps[k].last_forward)
            if effect is not None:
                ledger.remove(effect, gaps[k].last_forward)
    for k in range(len(gaps)):
        if expensive[k] and mode in ("swap", "both"):
            ledger.offload(k, gaps[k].last_forward)
    plan = Plan(decisions=gap_decisions(trace, ledger.triples(Action.SWAP), ledger.triples(Action.RECOMPUTE),
                                        load=ledger.planned))
    needed = smallest_fitting_budget(Simulator(trace, cost), plan, int(ledger.planned.max()))
    if needed > budget_bytes:
        raise infeasible(budget_bytes, needed, f"superneurons-modes:{mode}")
    return plan


def _expensive(trace: Trace, sid: int) -> bool:
    """True when the op that made `sid` is a convolution or a matrix product (a checkpoint)."""
    name = trace.ops[trace.producer(sid)].name.lower()
    return any(word in name for word in EXPENSIVE)


for _mode in MODES:
    register(f"superneurons-modes:{_mode}", f"SuperNeurons' {_mode} mode as paper 002 ran it (fixed plan)",
             decides=("recompute",) if _mode == "recompute" else ("swap",) if _mode == "swap" else
             ("swap", "recompute"), mode=_mode)(plan_superneurons_modes)

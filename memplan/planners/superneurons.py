"""SuperNeurons as HOME describes it (paper 004 §4.1): one fixed action per layer type.

"It only swaps the tensors of convolution layers and only recomputes the tensors in pool,
activation, local response normalization, and batch normalization layers": a feature map
(memplan.planners.kit.featuremaps) is swapped when a convolution made it, recomputed when the
last forward op that wrote it is a pooling, activation or normalisation op (a batch norm's
output that an in-place ReLU then overwrites is the ReLU's feature map), and kept otherwise
(fully connected, attention, element-wise sums, dropout). Swaps are prefetched one backward
layer ahead, recomputations follow the shared rules (a convolution output that a
recomputation reads is fetched back for it).

The rules ignore the budget; with a budget at or above the unconstrained peak nothing moves.
A plan the simulator cannot run under the budget raises the infeasible-budget error naming
the smallest budget it fits.
"""

from __future__ import annotations

import numpy as np

from ..model import Plan
from ..problem import Problem
from .base import infeasible, register
from .kit.featuremaps import DEFAULT_MIN_BYTES, KEEP, RECOMPUTE, SWAP, FeatureMaps, feature_maps
from .kit.ops import CONV_OPS, aten_name
from .kit.policy import INFEASIBLE, PolicyEvaluator
from .kit.prefetch import DEFAULT_LEAD
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
    policy = np.full(len(fm), KEEP, dtype=np.int8)
    for k, sid in enumerate(fm.storage):
        writer = max(j for j in trace.writers[int(sid)] if trace.ops[j].phase == "forward")
        op = trace.ops[writer]
        base = aten_name(op)
        if base in CONV_OPS:
            policy[k] = SWAP
        elif (base in RECOMPUTED_OPS or "pool" in op.module.rsplit(".", 1)[-1]) and fm.recomputable[k]:
            policy[k] = RECOMPUTE
    return policy


@register("superneurons", "SuperNeurons as HOME §4.1 describes it: swap conv outputs, recompute pool/activation/BN",
          decides=("swap", "recompute"))
def superneurons(problem: Problem, *, min_bytes: int = DEFAULT_MIN_BYTES, lead: int = DEFAULT_LEAD) -> Plan:
    """Swap convolution outputs, recompute pooling, activation and normalisation outputs.

    Args:
        trace, budget_bytes, cost, seed: see `memplan.planners.base` (no randomness here).
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

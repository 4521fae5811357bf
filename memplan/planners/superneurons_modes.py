"""SuperNeurons' three modes, as paper 002 ran them for its Fig. 5 (Wang et al. 2018).

SuperNeurons keeps the outputs of expensive layers (convolutions, matrix products) as
checkpoints and recomputes the cheap layers after them (pooling, activation, batch norm)
from the nearest checkpoint, and its tensor cache offloads convolution outputs to the
host. Paper 002 takes one point per mode:

- `superneurons-modes:recompute`: every saved activation made by a cheap op is dropped
  and recomputed before its first backward use (chains rebuild from the checkpoints);
- `superneurons-modes:swap`: every saved activation made by an expensive op is swapped
  (the cache under full memory pressure), prefetched in the order of paper 002 §4.5;
- `superneurons-modes:both`: the two together.

The plans ignore the budget; each raises `infeasible(...)` naming the smallest budget its
plan runs in. A recomputation that could not run (an input overwritten in place, or only
on the host) is left out. The HOME-paper SuperNeurons (budget-driven) is the joint
planners' `superneurons`.
"""

from __future__ import annotations

from ..model import Plan, Trace
from ..problem import Problem
from ..sim.simulate import Simulator
from .base import infeasible, register
from .kit.fitting import smallest_fitting_budget
from .kit.ledger import OFFLOAD, REMOVE, Ledger
from .kit.prefetch import gap_decisions
from .kit.saved import saved_gaps

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
    plan = Plan(decisions=gap_decisions(trace, ledger.triples(OFFLOAD), ledger.triples(REMOVE),
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

"""memplan: plan and run PyTorch training beyond GPU memory.

Record one training iteration (`trace`), plan where every tensor lives under a memory
budget (`plan`), score the plan (`simulate`, `validate`) and train under it (`optimize`).
Names are imported lazily so that `import memplan` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "trace": "memplan.trace.tracer",
    "trace_workload": "memplan.trace.tracer",
    "read_trace": "memplan.trace.io",
    "write_trace": "memplan.trace.io",
    "load_any": "memplan.trace.formats",
    "Trace": "memplan.trace.model",
    "Storage": "memplan.trace.model",
    "Op": "memplan.trace.model",
    "plan": "memplan.plan.base",
    "known_planners": "memplan.plan.base",
    "Plan": "memplan.plan.model",
    "Decision": "memplan.plan.model",
    "read_plan": "memplan.plan.model",
    "write_plan": "memplan.plan.model",
    "Cost": "memplan.cost.model",
    "get_profile": "memplan.cost.profiles",
    "simulate": "memplan.sim.simulate",
    "validate": "memplan.sim.validate",
    "optimize": "memplan.exec.api",
    "MemplanError": "memplan.errors",
    "InfeasibleBudgetError": "memplan.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'memplan' has no attribute {name!r}")

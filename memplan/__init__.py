"""memplan: plan and run PyTorch training beyond GPU memory. This module is the front door.

The five stages: record one training iteration (`trace`), plan where every tensor lives
under a memory budget (`plan`), turn the plan into the executor's step program (`compile`),
score it (`simulate`, `validate`) and train under it (`execute`); `optimize` does all of
them for one step function. A `Problem` is what the stages below the edge share: the trace,
its costs on a device profile, the cap and the seed (docs/architecture.md).
Names are imported lazily so that `import memplan` stays cheap.
"""

from __future__ import annotations

from .lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "trace": "memplan.tracing.tracer",
    "trace_workload": "memplan.workflows.workloads",
    "read_trace": "memplan.tracing.io",
    "write_trace": "memplan.tracing.io",
    "load_any": "memplan.tracing.formats",
    "Trace": "memplan.model",
    "Storage": "memplan.model",
    "Op": "memplan.model",
    "plan": "memplan.planners.base",
    "plan_problem": "memplan.planners.base",
    "known_planners": "memplan.planners.base",
    "Problem": "memplan.problem",
    "DEFAULT_PROFILE": "memplan.problem",
    "Budget": "memplan.budget",
    "UNLIMITED": "memplan.budget",
    "NO_LIMIT": "memplan.budget",
    "parse_budget": "memplan.budget",
    "compile": "memplan.sim.program:compile_plan",
    "StepProgram": "memplan.model.program",
    "Plan": "memplan.model",
    "Decision": "memplan.model",
    "read_plan": "memplan.model",
    "write_plan": "memplan.model",
    "Cost": "memplan.cost.model",
    "get_profile": "memplan.cost.profiles",
    "simulate": "memplan.sim.simulate",
    "validate": "memplan.sim.validate",
    "optimize": "memplan.workflows.optimize",
    "execute": "memplan.workflows.optimize",
    "OptimizedStep": "memplan.workflows.optimize",
    "write_report": "memplan.reports.plan_report",
    "MemplanError": "memplan.errors",
    "InfeasibleBudgetError": "memplan.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

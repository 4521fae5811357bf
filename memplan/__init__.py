"""memplan: plan and run PyTorch training beyond GPU memory. This module is the front door.

The five stages: record one training iteration (`trace`), plan where every tensor lives
under a memory budget (`plan`), turn the plan into the executor's step program (`compile`),
score it (`simulate`, `validate`) and train under it (`execute`); `optimize` does all of
them for one step function. A `Problem` is what the stages below the edge share: the trace,
its costs on a device profile, the cap and the seed; `RunOptions` is how a planned step runs
(docs/architecture.md). Every name here is on a page of the documentation (docs/api.md).

Names are imported lazily so that `import memplan` stays cheap. The command line
(memplan.commands), its reports and the benchmarks reach the library through this module and
through `memplan.services`, the rest of what they need.
"""

from __future__ import annotations

from .lazy import lazy_exports

__version__ = "0.1.0"

# name -> "module", or "module:attribute" where the public name differs there (memplan.lazy)
_EXPORTS = {
    # stages
    "trace": "memplan.tracing.tracer",
    "plan": "memplan.planners.base",
    "compile": "memplan.sim.program:compile_plan",
    "simulate": "memplan.sim.stage",
    "validate": "memplan.sim.validate",
    "execute": "memplan.workflows.optimize",
    "optimize": "memplan.workflows.optimize",
    "OptimizedStep": "memplan.workflows.optimize",
    # values: problems, budgets, plans
    "Problem": "memplan.problem",
    "RunOptions": "memplan.run_options",
    "DEFAULT_PROFILE": "memplan.problem",
    "cost_of": "memplan.problem",
    "Budget": "memplan.budget",
    "UNLIMITED": "memplan.budget",
    "Plan": "memplan.model",
    "Decision": "memplan.model",
    "read_plan": "memplan.model",
    "write_plan": "memplan.model",
    "StepProgram": "memplan.model.program",
    # traces and workloads
    "Trace": "memplan.model",
    "Storage": "memplan.model",
    "Op": "memplan.model",
    "read_trace": "memplan.tracing.io",
    "write_trace": "memplan.tracing.io",
    "load_any": "memplan.tracing.formats",
    "trace_workload": "memplan.workflows.workloads",
    "get_workload": "memplan.zoo.registry",
    # planners
    "known_planners": "memplan.planners.base",
    # simulation and cost
    "Cost": "memplan.cost.model",
    "get_profile": "memplan.cost.profiles",
    "calibrate": "memplan.cost.calibrate",
    # training and measurement
    "run_workload": "memplan.workflows.run",
    "max_batch": "memplan.workflows.maxbatch",
    # reports
    "write_report": "memplan.reports.plan_report",
    "compare": "memplan.reports.compare",
    "sweep": "memplan.reports.sweep",
    # errors
    "MemplanError": "memplan.errors",
    "InfeasibleBudgetError": "memplan.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

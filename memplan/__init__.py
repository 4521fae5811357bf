"""memplan: plan and run PyTorch training beyond GPU memory. This module is the front door.

The five stages: record one training iteration (`trace`), plan where every tensor lives
under a memory budget (`plan`), turn the plan into the executor's step program (`compile`),
score it (`simulate`, `validate`) and train under it (`execute`); `optimize` does all of
them for one step function. A `Problem` is what the stages below the edge share: the trace,
its costs on a device profile, the cap and the seed (docs/architecture.md).
Names are imported lazily so that `import memplan` stays cheap. The command line
(memplan.commands) reaches the library only through this module.
"""

from __future__ import annotations

from .lazy import lazy_exports

__version__ = "0.1.0"

# name -> "module", or "module:attribute" where the public name differs there (memplan.lazy)
_EXPORTS = {
    # stages
    "trace": "memplan.tracing.tracer",
    "plan": "memplan.planners.base",
    "plan_problem": "memplan.planners.base",
    "compile": "memplan.sim.program:compile_plan",
    "simulate": "memplan.sim.stage",
    "validate": "memplan.sim.validate",
    "execute": "memplan.workflows.optimize",
    "optimize": "memplan.workflows.optimize",
    "OptimizedStep": "memplan.workflows.optimize",
    # values: problems, budgets, plans
    "Problem": "memplan.problem",
    "DEFAULT_PROFILE": "memplan.problem",
    "cost_of": "memplan.problem",
    "Budget": "memplan.budget",
    "UNLIMITED": "memplan.budget",
    "NO_LIMIT": "memplan.budget",
    "parse_budget": "memplan.budget",
    "Plan": "memplan.model",
    "Decision": "memplan.model",
    "read_plan": "memplan.model",
    "write_plan": "memplan.model",
    "StepProgram": "memplan.model.program",
    "ActionKind": "memplan.model.program",
    "Rebuild": "memplan.model.program",
    "ReplayStep": "memplan.model.program",
    "check_plan": "memplan.model",
    # traces and workloads
    "Trace": "memplan.model",
    "Storage": "memplan.model",
    "Op": "memplan.model",
    "read_trace": "memplan.tracing.io",
    "write_trace": "memplan.tracing.io",
    "load_any": "memplan.tracing.formats",
    "collective_totals": "memplan.tracing.collectives",
    "trace_workload": "memplan.workflows.workloads",
    "trace_rank": "memplan.workflows.distributed",
    "check_world_size": "memplan.workflows.distributed",
    "get_workload": "memplan.zoo.registry",
    "check_model_name": "memplan.zoo.registry",
    "parse_model_config": "memplan.zoo.config:parse_config",
    "parse_config_value": "memplan.zoo.config:parse_value",
    # planners
    "known_planners": "memplan.planners.base",
    "get_planner": "memplan.planners.base",
    "load_min_bytes": "memplan.planners.autoswap",
    "check_planner_params": "memplan.planners.base:check_params",
    # simulation and cost
    "Simulator": "memplan.sim.simulate",
    "simulator_of": "memplan.sim.simulate",
    "compile_program": "memplan.sim.program",
    "program_residencies": "memplan.sim.program:residencies",
    "simulation_profile": "memplan.sim.stage",
    "plan_cost": "memplan.sim.stage",
    "simulate_comm": "memplan.sim.comm",
    "Cost": "memplan.cost.model",
    "get_profile": "memplan.cost.profiles",
    "profile_to_json": "memplan.cost.profiles",
    "calibrate": "memplan.cost.calibrate",
    "calibrate_cpu": "memplan.cost.calibrate_cpu",
    "with_executor_costs": "memplan.workflows.calibrate_executor",
    # pool
    "solve_pool": "memplan.pool.api:solve",
    "residency_pool_problem": "memplan.pool.intervals:residency_problem",
    "storage_pool_problem": "memplan.pool.problem:from_storages",
    "is_minimalloc_csv": "memplan.pool.problem",
    "read_minimalloc_csv": "memplan.pool.problem",
    "plot_pool_layout": "memplan.pool.plot:plot_layout",
    "pool_command_limit_s": "memplan.pool.time_limit:command_limit_s",
    "POOL_ALLOCATORS": "memplan.pool.allocators.base:ALLOCATORS",
    # convolutions
    "ConvDB": "memplan.conv.db",
    "ConvDBRow": "memplan.conv.db:Row",
    "get_conv_source": "memplan.conv.sources:get_source",
    "parse_conv_kernel": "memplan.conv.kernels:parse_kernel",
    "trace_conv_kernels": "memplan.conv.kernels:trace_kernels",
    "conv_policy_sizes": "memplan.conv.options:policy_sizes",
    "read_conv_csv": "memplan.conv.deepbench",
    # DQN
    "DQN_MIN_BYTES": "memplan.planners.dqn:DEFAULT_MIN_BYTES",
    "DQNTrainConfig": "memplan.planners.dqn.train:TrainConfig",
    "train_dqn_weights": "memplan.planners.dqn:train_weights",
    "dqn_default_budgets": "memplan.planners.dqn:default_budgets",
    "save_dqn_weights": "memplan.planners.dqn.net:save_weights",
    "load_dqn_weights": "memplan.planners.dqn.net:load_weights",
    # training and measurement
    "run_workload": "memplan.workflows.run",
    "trace_step": "memplan.workflows.step_trace",
    "input_signature": "memplan.workflows.step_trace",
    "measure_steps": "memplan.workflows.measure",
    "Metering": "memplan.workflows.measure",
    "RunOptions": "memplan.run_options",
    "time_steps": "memplan.workflows.measure",
    "check_baseline": "memplan.workflows.run",
    "measured_objective": "memplan.workflows.run",
    "BUDGET_TOLERANCE": "memplan.workflows.run",
    "RESERVED_TOLERANCE": "memplan.workflows.memory_cap",
    "AllocatorMode": "memplan.run_options",
    "max_batch": "memplan.workflows.maxbatch",
    "fit_distributed": "memplan.workflows.fit:fit",
    "FIT_PLANNERS": "memplan.workflows.fit:DEFAULT_PLANNERS",
    # reports
    "write_report": "memplan.reports.plan_report",
    "compare": "memplan.reports.compare",
    "CompareSettings": "memplan.reports.compare_settings",
    "CALIBRATED_CPU_PROFILE": "memplan.reports.compare_settings:CPU_PROFILE",
    "CALIBRATED_GPU_PROFILE": "memplan.reports.compare_settings:GPU_PROFILE",
    "write_compare_report": "memplan.reports.compare_report:write_report",
    "sweep": "memplan.reports.sweep",
    "plot_pareto": "memplan.reports.sweep",
    # errors
    "MemplanError": "memplan.errors",
    "InfeasibleBudgetError": "memplan.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)

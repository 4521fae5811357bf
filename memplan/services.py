"""The command line's services: what memplan's commands, reports and benchmarks use beyond the front door.

`memplan` (the front door) holds the stages and values a user needs. The commands need more: a
planner's parameter check, the pool's allocators and solver, DQN's training, the convolution
database, the distributed trace's helpers, the measurement loop. They reach the library through
this module (and the front door), never its packages directly (import-linter checks it), so that
what the command line depends on is one list. Each name is documented where it is defined.

Names are imported lazily, as the front door's are: a command's parser stays fast.
"""

from __future__ import annotations

from .lazy import lazy_exports

# name -> "module", or "module:attribute" where the public name differs there (memplan.lazy)
_EXPORTS = {
    # planning a Problem already made
    "plan_problem": "memplan.planners.base",
    # values: problems, budgets, plans
    "NO_LIMIT": "memplan.budget",
    "parse_budget": "memplan.budget",
    "ActionKind": "memplan.model.program",
    "Rebuild": "memplan.model.program",
    "ReplayStep": "memplan.model.program",
    "check_plan": "memplan.model",
    # traces and workloads
    "collective_totals": "memplan.tracing.collectives",
    "trace_rank": "memplan.workflows.distributed",
    "check_world_size": "memplan.workflows.distributed",
    "check_model_name": "memplan.zoo.registry",
    "parse_model_config": "memplan.zoo.config:parse_config",
    "parse_config_value": "memplan.zoo.config:parse_value",
    # planners
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
    "profile_to_json": "memplan.cost.profiles",
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
    "trace_step": "memplan.workflows.step_trace",
    "input_signature": "memplan.workflows.step_trace",
    "measure_steps": "memplan.workflows.measure",
    "Metering": "memplan.workflows.measure",
    "time_steps": "memplan.workflows.measure",
    "check_baseline": "memplan.workflows.run",
    "measured_objective": "memplan.workflows.run",
    "BUDGET_TOLERANCE": "memplan.workflows.run",
    "RESERVED_TOLERANCE": "memplan.workflows.memory_cap",
    "AllocatorMode": "memplan.run_options",
    "fit_distributed": "memplan.workflows.fit:fit",
    "FIT_PLANNERS": "memplan.workflows.fit:DEFAULT_PLANNERS",
    # reports
    "CompareSettings": "memplan.reports.compare_settings",
    "CALIBRATED_CPU_PROFILE": "memplan.reports.compare_settings:CPU_PROFILE",
    "CALIBRATED_GPU_PROFILE": "memplan.reports.compare_settings:GPU_PROFILE",
    "write_compare_report": "memplan.reports.compare_report:write_report",
    "plot_pareto": "memplan.reports.sweep",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)  # each documented where it is defined, not on a page of its own

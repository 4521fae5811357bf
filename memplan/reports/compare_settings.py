"""What `memplan compare` covers: its settings and their defaults (apart from the comparison
itself, memplan.reports.compare, which imports torch, so that the command line can show the
defaults without importing it)."""

from __future__ import annotations

from dataclasses import dataclass

from ..problem import DEFAULT_PROFILE

DEFAULT_MODELS = ("resnet18-cifar", "vgg11-cifar")
DEFAULT_SIM_PLANNERS = ("none", "sqrt-n", "checkpoint-all", "save-on-cpu", "autoswap:doa", "autoswap:swdoa",
                        "capuchin", "superneurons", "home:fast", "dtr", "milp")
DEFAULT_RUN_PLANNERS = ("none", "sqrt-n", "checkpoint-all", "capuchin", "dtr")
DEFAULT_BASELINES = ("torch-checkpoint", "sac-compute", "save-on-cpu", "compile-budget:0.5")
DEFAULT_MAXBATCH_PLANNERS = ("none", "sqrt-n", "checkpoint-all", "capuchin", "dtr")
DEFAULT_BUDGETS = ("70%", "50%")
CPU_PROFILE = "cpu"  # run_profile meaning "this CPU, calibrated" (`calibrate --device cpu`)
CPU_PROFILE_FILE = "cpu_profile.json"
GPU_PROFILE = "gpu"  # run_profile meaning "this GPU, calibrated" (`memplan calibrate`), with device cuda
GPU_PROFILE_FILE = "gpu_profile.json"
TOOL_PREFIX = "torch:"  # a measured point of PyTorch's own tool, not of a memplan planner
# Search planners get a short limit so the default comparison stays bounded.
PLANNER_PARAMS = {"home:fast": {"time_limit_s": 5.0}, "home": {"time_limit_s": 5.0}, "milp": {"time_limit_s": 10.0}}
NO_BUDGET = "-"  # the budget of a PyTorch tool that ignores it
METERED_STEPS = 2  # steps of a measured point run under the meter (its peak); the rest are timed without it


@dataclass(frozen=True, kw_only=True)
class CompareSettings:
    """What one comparison covers."""

    models: tuple[str, ...] = DEFAULT_MODELS  # zoo model names
    sim_planners: tuple[str, ...] = DEFAULT_SIM_PLANNERS  # planners simulated on fake traces
    run_planners: tuple[str, ...] = DEFAULT_RUN_PLANNERS  # planners measured on CPU (none always added)
    baselines: tuple[str, ...] = DEFAULT_BASELINES  # PyTorch tools measured on CPU
    maxbatch_planners: tuple[str, ...] = DEFAULT_MAXBATCH_PLANNERS  # planners whose largest batch is searched
    budgets: tuple[str, ...] = DEFAULT_BUDGETS  # shares of the unplanned peak
    sim_batch: int = 64  # batch of the simulated traces
    run_batch: int = 8  # batch of the measured runs
    steps: int = 5  # measured steps per run (the first is a warm-up)
    profile: str = DEFAULT_PROFILE  # cost-model profile of the simulated points
    run_profile: str = CPU_PROFILE  # profile the measured points plan with (CPU_PROFILE, GPU_PROFILE: calibrate)
    device: str = "cpu"  # where the measured points train: "cpu", or a CUDA device ("cuda", "cuda:1")
    memory_cap: int | None = None  # emulate a device this large for the measured points (run --memory-cap)
    maxbatch_memory: int | None = None  # the cap of the maxbatch search; None: the unplanned peak at sim_batch
    maxbatch_limit: int = 256  # largest batch the search tries
    seed: int = 0  # planner and training seed

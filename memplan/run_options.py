"""How a planned step is run, made once at the edge: `RunOptions`.

Beside the `Problem` (what is planned: the trace, its costs, the cap, the seed), a run has its
options: where it trains, how many steps are measured and on which clock, which executor level,
CUDA allocator and graph capture it uses, the memory cap it emulates, whether it is compiled or
checked against plain training. The edge (`memplan run`, `memplan.optimize`, `run_workload`, the
integrations) makes one `RunOptions` (`RunOptions.of` adds fields by name to one made already); it
checks every value and their combinations when it is made, and everything under it reads the
fields and checks nothing again.

`optimize` and `run_workload` keep taking the options as loose keywords (`compile=True`,
`steps=3`): `split_options` separates them from a planner's hyper-parameters.

Importing it is light (no torch): a command's parser names the vocabularies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .errors import MemplanError
from .problem import DEFAULT_PROFILE
from .vocabulary import Vocabulary


class Clock(Vocabulary):
    """What step times (and a CPU trace's op times) measure (memplan.tracing.optimes.CLOCKS)."""

    WALL = "wall"  # wall time
    CPU = "cpu"  # the calling thread's CPU time, which a shared host's other work does not inflate


class Executor(Vocabulary):
    """Which executor level runs a plan (memplan.exec)."""

    AUTO = "auto"  # at autograd's hooks where the plan can run there (memplan.exec.hooked), else interpreted
    INTERPRETED = "interpreted"  # always the dispatch-mode runner (memplan.exec.interpreted)


class GraphMode(Vocabulary):
    """Whether the planned step is captured as a CUDA graph (memplan.workflows.cuda_graph)."""

    AUTO = "auto"  # where it can be, else eager with a warning saying why
    ON = "on"  # where it cannot be, that is an error
    OFF = "off"  # never


class AllocatorMode(Vocabulary):
    """The CUDA allocator a run uses (`memplan run --allocator`, memplan.workflows.allocators)."""

    AUTO = "auto"  # chosen for the run (`choose_allocator`)
    CACHING = "caching"  # PyTorch's caching allocator as configured
    EXPANDABLE = "expandable"  # the same with expandable segments
    POOL = "pool"  # the plan's layout, served by memplan's replay allocator


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a planned step runs and is measured (every field has the default a user gets)."""

    profile: str = DEFAULT_PROFILE  # the cost model's device profile the planner plans for (a name or a file)
    seed: int = 0  # workload, planner and training seed
    device: str = "cpu"  # where `run_workload` trains (`optimize` runs where its inputs are)
    steps: int = 3  # metered steps of `run_workload`
    timed_steps: int = 0  # then steps timed without the meter
    clock: str = Clock.WALL.value  # what timed steps and a CPU trace's op times measure
    time_repeats: int = 0  # on the CPU, time every op of a real trace (the least of this many iterations)
    measure: bool | str = "first"  # which steps' peak is measured and checked: "first" of each plan, True, False
    fake: bool | None = None  # trace fake copies (None: on a GPU, where the unplanned step may not fit)
    executor: str = Executor.AUTO.value  # the executor level
    allocator: str = AllocatorMode.AUTO.value  # the CUDA allocator of `run_workload`
    memory_cap: int | None = None  # emulate a device with this many bytes (None: the device's own)
    cuda_graph: str = GraphMode.OFF.value  # capture the planned step as a CUDA graph
    compile: dict | None = None  # torch.compile's keyword arguments: the plan runs compiled (None: eager)
    baseline: str | None = None  # a PyTorch tool `run_workload` runs instead of a plan
    check: bool = False  # `run_workload` also trains plainly and reports the largest differences

    def __post_init__(self):
        # `compile` may be given as True or False too; every value and combination is checked here, once
        object.__setattr__(self, "compile", _compile_settings(self.compile))
        self.check_values()

    @classmethod
    def of(cls, options: RunOptions | None = None, **given) -> RunOptions:
        """`options` (default: the defaults) with the fields `given` by name; `compile` may be True
        or False as well as torch.compile's keyword arguments.

        Raises:
            MemplanError: an unknown name, or a value or a combination that cannot run.
        """
        unknown = sorted(set(given) - OPTION_NAMES)
        if unknown:
            raise MemplanError(f"unknown run options {', '.join(unknown)}; known: {', '.join(sorted(OPTION_NAMES))}")
        return replace(options if options is not None else cls(), **given)

    @property
    def compiled(self) -> bool:
        """Whether the plan runs through torch.compile."""
        return self.compile is not None

    @property
    def hooked(self) -> bool:
        """Whether a plan may run at autograd's hooks (where it can, and the model is known)."""
        return self.executor == Executor.AUTO

    def check_values(self) -> None:
        """Refuse a value or a combination that cannot run, in the words of the Python API.

        Raises:
            MemplanError: one line naming what is wrong.
        """
        _one_of("clock", self.clock, Clock.names(), f"clock {self.clock!r}: expected one of {', '.join(Clock.names())}")
        _one_of("executor", self.executor, Executor.names())
        _one_of("cuda_graph", self.cuda_graph, GraphMode.names())
        _one_of("allocator", self.allocator, AllocatorMode.names(),
                f"unknown allocator {self.allocator!r}; known: {', '.join(AllocatorMode.names())}")
        if self.compiled and (self.cuda_graph != GraphMode.OFF or self.executor != Executor.AUTO):
            raise MemplanError("compile runs the step through torch.compile, not memplan's executor: leave executor and "
                               "cuda_graph out (for CUDA graphs, compile={'mode': 'reduce-overhead'})")
        if self.compiled and self.baseline:
            raise MemplanError(f"compile runs a plan through torch.compile; --baseline {self.baseline} runs no plan "
                               f"(for PyTorch's compiled tool, --baseline compile-budget)")


OPTION_NAMES = frozenset(f.name for f in fields(RunOptions))


def split_options(keywords: dict) -> tuple[dict, dict]:
    """(the run options among `keywords`, the rest: a planner's hyper-parameters)."""
    return ({k: v for k, v in keywords.items() if k in OPTION_NAMES},
            {k: v for k, v in keywords.items() if k not in OPTION_NAMES})


def _compile_settings(compile) -> dict | None:
    """torch.compile's keyword arguments from `compile=` (True: its defaults), None without compile."""
    if compile is False or compile is None:
        return None
    if not isinstance(compile, (bool, dict)):
        raise MemplanError(f"compile must be True, False or a dict of torch.compile's keyword arguments, "
                           f"got {compile!r}")
    return {} if compile is True else dict(compile)


def _one_of(name: str, value, known: tuple[str, ...], message: str | None = None) -> None:
    if value not in known:
        raise MemplanError(message or f"{name} must be one of {', '.join(known)}, got {value!r}")

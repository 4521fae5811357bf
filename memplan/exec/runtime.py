"""PlanRuntime: everything that runs one step program on one model, installed and removed as a unit.

It owns the copy lanes, the host slab (laid out offline from the program), the step runner of
the program's level (`StepProgram.level`: at autograd's hooks, memplan.exec.hooked; else the
interpreted one, a dispatch mode that runs the program's actions at every op,
memplan.exec.interpreted; both are memplan.exec.mover's Movers and count in its ExecStats) and
the memory meter that measures every step. `installed()` enters the meter and the runner (in that order: the
meter sees what the runner does) and any hooks; leaving it removes all of them.

Storages whose gap crosses the iteration boundary stay on the host between two steps.
While they are away outside a step, calling the model, the optimizer's step,
`state_dict()` or `load_state_dict()` of either brings them back first, and so does any
op that touches them while the runner is installed; otherwise call `restore()` before
touching them. `close()` brings everything back and releases the slab and the lanes.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict

import torch

from ..budget import bytes_to_json
from ..errors import MemplanError
from ..model import Trace
from ..model.program import HOOKED, StepProgram
from .engine import CopyEngine, engine_for
from .hooked import HookedRunner
from .meter import MemoryMeter
from .interpreted import InterpretedRunner
from .slab import HostSlab, host_layout

log = logging.getLogger(__name__)

MEASURE_CHOICES = ("first", True, False)  # which steps the meter measures: the first, every one, none
# A measured step above its budget by more than this share is over it (the meter sees what the trace
# does not: an op's internal scratch memory, on a GPU the allocator's rounding).
BUDGET_TOLERANCE = 0.02


class PlanRuntime:
    """Runs `program` (compiled for `trace`) on `model`.

    Args:
        trace: the traced iteration.
        program: the step program.
        model: the root module (owned storages are found through it).
        device: where the model's tensors live (picks the copy engine and the meter).
        engine: a copy engine to use instead (tests pass a delayed one).
        optimizer: the model's optimizer (its state is found through it).
        measure: which steps' peak memory to measure (see `meter.py`): "first" (the first
            step; each step runs the same program), True (every step) or False (none).
    """

    def __init__(self, trace: Trace, program: StepProgram, model: torch.nn.Module | None = None, *,
                 device: torch.device | str = "cpu", engine: CopyEngine | None = None,
                 optimizer: torch.optim.Optimizer | None = None, measure: bool = True):
        self.trace = trace
        self.program = program
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.engine = engine or engine_for(self.device)
        layout = host_layout(trace, program)
        self.slab = HostSlab(layout, pin=self.device.type == "cuda" and layout.nbytes > 0)
        if program.level == HOOKED:
            self.runner = HookedRunner(trace, program, self.engine, self.slab, model, optimizer, self.device)
        else:
            self.runner = InterpretedRunner(trace, program, self.engine, self.slab, model, optimizer)
        if measure not in MEASURE_CHOICES:
            raise MemplanError(f"measure must be one of {', '.join(map(repr, MEASURE_CHOICES))}, got {measure!r}")
        self.measure = measure
        self.meter = MemoryMeter(self.device) if measure else None
        if self.meter is not None:
            self.meter.exclude(self.host_buffers())
            self.meter.active = False  # until a measured step begins
        self.steps: list[dict] = []  # one record per step run
        self.pool = None  # a PoolSession (memplan.exec.pooled) serving the plan's layout, once attached
        self._idle_guards: list = []
        self._in_step = False
        self._before = self._counters()  # the runner's counts when the current step began
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close()` ran: no step runs under this runtime any more."""
        return self._closed

    def _counters(self) -> dict:
        """The runner's counts that each step reports (what this step added to them)."""
        stats = self.runner.stats
        return {"diverged_steps": stats.diverged_steps, "unresolved": stats.unresolved,
                "ops_in_mode": stats.ops_in_mode, "replayed_ops": stats.replayed_ops,
                "regions_recomputed": stats.regions_recomputed, "host_s": stats.host_s,
                "hook_calls": stats.hook_calls}

    def host_buffers(self) -> tuple:
        """Host memory beside the device role (a meter must not count it)."""
        return (self.slab.buffer,)

    # --- steps ----------------------------------------------------------------------------

    def settle(self) -> None:
        """Send to the host what the program keeps there between steps (before the first one)."""
        self.runner.settle()
        self._guard_idle()

    def begin_step(self, inputs=()) -> None:
        """Start one training iteration (ends the previous one if it is still open)."""
        self.end_step()
        self.runner.begin_step()
        self._before = self._counters()
        if self.meter is not None and (self.measure != "first" or not self.steps):
            self.meter.active = True
            self.meter.track((self._persistent(), inputs))
            self.meter.reset_peak()
        if self.pool is not None:
            self.pool.begin_step()  # last: the pool's iteration is the step's requests only
        self._in_step = True

    def end_step(self, aborted: bool = False) -> None:
        """Close the current iteration and record what it measured (`aborted`: an exception cut it
        short; storages it copied away come back, those it dropped are forgotten with its graph)."""
        if not self._in_step:
            return
        self._in_step = False
        if self.pool is not None:
            self.pool.end_step()
        self.runner.end_step(aborted)
        record = {"step": len(self.steps), **{k: v - self._before[k] for k, v in self._counters().items()}}
        record["diverged"] = record.pop("diverged_steps") > 0
        record["aborted"] = aborted
        if record["unresolved"]:
            log.warning("step %d: %d planned actions found no storage of the traced size where the trace put it; "
                        "those storages stayed resident (more memory than planned)", record["step"],
                        record["unresolved"])
        if self.meter is not None and self.meter.active:
            self.meter.active = False
            record.update(self.meter.peak())
            record["over_budget"] = self._over_budget(record["step"], record["measured_peak_bytes"])
        self.steps.append(record)

    def _over_budget(self, step: int, measured: int) -> bool:
        """Whether step `step` measured more than its budget allows; a warning says so."""
        budget = self.program.budget_bytes
        if measured <= budget * (1 + BUDGET_TOLERANCE):
            return False
        log.warning("step %d measured %d bytes, above its budget of %d bytes (the plan's program holds at most "
                    "%s): memory the trace does not have, such as another batch kept alive, inputs of another "
                    "size, or on a GPU what libraries and the allocator take", step, measured, budget,
                    self.program.predicted.peak_load_bytes)
        return True

    @contextlib.contextmanager
    def installed(self, auto_steps: bool = False):
        """Install the meter, the runner and any hooks for the block; remove them all on exit.

        Args:
            auto_steps: start a new iteration at each call of the root model's forward
                (for a training loop the user owns).
        """
        if self._closed:
            raise RuntimeError("this PlanRuntime was closed")
        self._drop_idle_guards()
        with contextlib.ExitStack() as stack:
            stack.callback(self._guard_idle)
            stack.push(lambda kind, *_: self.end_step(aborted=kind is not None))  # returns None: errors propagate
            # on a GPU the allocator's counters are the meter; on the CPU its mode is entered only
            # for steps it measures (an inactive meter's mode would still cost every op a dispatch)
            if self.meter is not None and not self.meter.cuda and (self.measure is True or not self.steps):
                stack.enter_context(self.meter)
            if not self.runner.idle or self.pool is not None:  # without actions or a pool: no per-op work
                stack.enter_context(self.runner)
            if auto_steps and self.model is not None:
                # first among the model's pre-hooks: the runner's own sees the step begun
                handle = self.model.register_forward_pre_hook(lambda m, a: self.begin_step(a), prepend=True)
                stack.callback(handle.remove)
            yield self

    def stop_measuring(self) -> None:
        """Measure no more steps (between steps): on the CPU the meter's bookkeeping costs time."""
        if self.meter is not None:
            self.meter.close()
            self.meter = None

    def _persistent(self) -> list:
        """Tensors alive across steps: parameters, buffers, gradients and optimizer state."""
        out = []
        if self.model is not None:
            out += list(self.model.parameters()) + list(self.model.buffers())
            out += [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.optimizer is not None:
            out += [v for state in self.optimizer.state.values() for v in state.values()
                    if isinstance(v, torch.Tensor)]
        return out

    # --- storages away between steps ---------------------------------------------------------

    def restore(self) -> None:
        """Bring back every storage the program left on the host."""
        self.runner.restore()

    def _guard_idle(self) -> None:
        """Outside a step, using the model or optimizer first brings everything back."""
        if not self.runner.away or self._idle_guards:
            return

        def bring_back(*args, **kwargs):
            self.restore()  # the handles go at the next step or at close: hooks may be iterated now

        owners = [o for o in (self.model, self.optimizer) if o is not None]
        self._idle_guards = [register(bring_back) for o in owners for register in (
            o.register_forward_pre_hook if isinstance(o, torch.nn.Module) else o.register_step_pre_hook,
            o.register_state_dict_pre_hook, o.register_load_state_dict_pre_hook)]

    def _drop_idle_guards(self) -> None:
        handles, self._idle_guards = self._idle_guards, []
        for handle in handles:
            handle.remove()

    # --- results ----------------------------------------------------------------------------

    def stats(self) -> dict:
        """Counters, host memory, and the measured against the simulated peak per step."""
        measured = [s for s in self.steps if s.get("measured_peak_bytes") is not None]
        return {**asdict(self.runner.stats), "level": self.program.level,
                "decisions": len(self.program.decisions), "slab_bytes": self.slab.nbytes,
                "pinned_host_bytes": self.slab.nbytes if self.slab.pin else 0,
                "budget_bytes": bytes_to_json(self.program.budget_bytes),
                "simulated_peak_bytes": self.program.predicted.peak_load_bytes,
                "measured_peak_bytes": max((s["measured_peak_bytes"] for s in measured), default=None),
                "over_budget_steps": [s["step"] for s in measured if s["over_budget"]],
                "steps_measured": measured}

    def close(self) -> None:
        """Bring storages back, wait for pending copies, then release the lanes and the slab."""
        if self._closed:
            return
        self._closed = True
        try:
            self.end_step()
            self.restore()
        finally:
            self._drop_idle_guards()
            self.engine.close()
            self.slab.release()
            if self.meter is not None:
                self.meter.close()

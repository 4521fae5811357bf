"""`optimize(..., cuda_graph=...)` and `memplan run --cuda-graph`: capture the planned step as a CUDA graph.

Modes: "auto" captures the step where it can be captured (memplan.exec.capturable) and runs on
CUDA; where it cannot, one logged warning says why and the eager executor runs. "on" makes that
an error (MemplanError: on the command line one line and exit 2), and so is "on" off CUDA. "off"
(the default until a GPU run shows captures work: the first, on an H200, captured nothing) never
captures. On the CPU "auto" means off.

Each call of the step runs eagerly under the plan for the warm-up steps (memplan.exec.graphed;
while the budget keeper may still plan again, warm-up goes on), then one call captures the step
and replays it, and every later call replays it. A call whose inputs differ from the captured
ones in shape, dtype or other values, or whose optimizer's hyper-parameters that are numbers
(a float learning rate a scheduler changed) differ from the captured ones, runs eagerly, with a
warning ("auto"), or fails ("on").
"""

from __future__ import annotations

import logging

import torch

from ..errors import MemplanError
from ..exec.capturable import (CaptureCheck, Refusal, check_program, check_step, hyper_change, hyper_parameters,
                               input_change)
from ..exec.engine import CudaCopyEngine
from ..exec.graph_schedule import capture_schedule
from ..exec.graphed import WARMUP_STEPS, CaptureEngine, GraphedStep, constants_of
from ..run_options import GraphMode
from ..sim.replayed import replay_time_s
from .step_trace import input_signature

log = logging.getLogger(__name__)

GRAPH_MODES = GraphMode.names()
NOT_CUDA = "the step runs on the {device}: a CUDA graph needs a CUDA device"
OFF = "cuda_graph is off"
OWN_LOOP = "a training loop of your own runs eagerly: the graph replays calls of the step"
PREFIX = "cannot capture the step as a CUDA graph: "
CONSTANT_CHANGED = "differs from the captured one (a graph replays the values it captured)"


def check_mode(mode: str, device: torch.device) -> None:
    """Raise MemplanError for an unknown mode, or "on" where the step does not run on CUDA."""
    if mode not in GRAPH_MODES:
        raise MemplanError(f"cuda_graph must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    if mode == "on" and device.type != "cuda":
        raise MemplanError(f"--cuda-graph on: {NOT_CUDA.format(device=device.type.upper())}")


class CudaGraphs:
    """The graph side of one OptimizedStep: whether it is captured, and the graph once it is.

    Args:
        mode: one of GRAPH_MODES.
        device: where the step runs.
        check: the step's capturability (memplan.exec.capturable.check_step).
        fake: the step was traced on fake tensors only (nothing to capture).
        cuda: the CUDA runtime (None: torch.cuda; memplan.testing.cuda_rules' CPU stand-in runs the copy
            lanes on itself even when nothing is captured).
    Raises:
        MemplanError: mode "on" and a step that cannot be captured.
    """

    def __init__(self, mode: str, device: torch.device, check: CaptureCheck, fake: bool = False, cuda=None):
        self.mode = mode
        self.device = device
        self.cuda = cuda
        self.check = check
        self.graphed: GraphedStep | None = None
        self.hyper: dict = {}  # the optimizer's hyper-parameters the graph captured as values
        self.phase = ""  # the call under way: a warm-up, the capture, a replay
        self.refused_calls = 0
        self.reason = (OFF if mode == "off" else NOT_CUDA.format(device=device.type.upper())
                       if device.type != "cuda" else "the step was traced on fake tensors only" if fake
                       else check.reason)
        self.active = not self.reason
        if mode == "on" and not self.active:
            raise MemplanError(PREFIX + self.reason)
        if mode == "auto" and device.type == "cuda" and not self.active:
            log.warning("%s%s; the eager executor runs", PREFIX, self.reason)

    def engine(self):
        """The copy engine a runtime of this step needs (None: the device's own)."""
        if self.active:
            return CaptureEngine(self.device, cuda=self.cuda or torch.cuda)
        return None if self.cuda is None else CudaCopyEngine(self.device, cuda=self.cuda)

    def own_loop(self) -> None:
        """A loop the user owns runs the step: nothing is captured ("on": an error)."""
        if self.active:
            self._give_up(OWN_LOOP)

    def refuse_call(self, refusal: Refusal) -> None:
        """A call the graph cannot replay: it runs eagerly, with one warning ("on": an error)."""
        self.refused_calls += 1
        if self.mode == "on":
            raise MemplanError(PREFIX + refusal.line())
        if self.refused_calls == 1:
            log.warning("%s%s; such calls run eagerly", PREFIX, refusal.line())

    def run(self, step, inputs: tuple):
        """One call of OptimizedStep `step`: a warm-up step, the capture, or a replay.

        Raises:
            RuntimeError: the step was closed (its graph would replay into released memory).
        """
        if step.runtime.closed:
            raise RuntimeError("this PlanRuntime was closed")
        try:
            return self._run(step, inputs)
        except BaseException as exc:  # which call of the graph's life it was (a failing GPU row names it)
            if getattr(exc, "memplan_phase", None) is None:
                exc.memplan_phase = self.phase
            raise

    def _run(self, step, inputs: tuple):
        g = self.graphed
        if g is None or g.runtime is not step.runtime:  # a new plan warms up and is captured anew
            g = self.graphed = GraphedStep(step.run_installed, step.runtime, self.device)
        if g.graph is None and (g.warmed < WARMUP_STEPS or not step.settled):
            self.phase = f"warm-up {g.warmed + 1}"
            out = g.warm_up(inputs)
            step.keep_budget()
            return out
        if g.graph is None:
            self.phase = "the capture"
            why = next((r.line() for r in check_program(step.program, step.trace)), "") or g.capture(inputs)
            if why:
                self._give_up(why)
                return step.run_planned(inputs)
            self.hyper = hyper_parameters(step.runtime.optimizer)
        else:
            refusal = (Refusal(what="an input that is not a tensor", cause=CONSTANT_CHANGED)
                       if constants_of(inputs) != g.constants else hyper_change(self.hyper, step.runtime.optimizer))
            if refusal is not None:
                self.phase = "an eager call the graph refused"
                self.refuse_call(refusal)
                return step.run_planned(inputs)
        self.phase = f"replay {g.replays + 1}"
        return g.replay(inputs)

    def close(self) -> None:
        """Release the graph (memplan.exec.graphed, rule 11)."""
        if self.graphed is not None:
            self.graphed.release()

    def _give_up(self, reason: str) -> None:
        if self.mode == "on":
            raise MemplanError(PREFIX + reason)
        if self.active:
            log.warning("%s%s; the eager executor runs", PREFIX, reason)
        self.active, self.reason = False, reason

    def report(self, step) -> dict:
        """JSON-ready: the mode, whether it is captured and why not, what the check refused, the capture
        schedule of the step's program, and once captured the warm-up, replays and memory."""
        captured = self.graphed is not None and self.graphed.graph is not None
        pooled = step.runtime.pool is not None  # the pool allocator serves the plan's layout
        schedule = capture_schedule(step.trace, step.program, step.signature,
                                    layout_bytes=step.plan.pool_bytes if pooled else None,
                                    predicted_replay_s=replay_time_s(step.trace, step.plan, step.problem.cost,
                                                                     step.program.budget_bytes))
        reason = "" if captured else self.reason or (
            f"warming up: {self.graphed.warmed if self.graphed else 0} of the {WARMUP_STEPS} eager steps before "
            f"the capture ran")
        out = {"mode": self.mode, "captured": captured, "reason": reason,
               "capturable": self.check.capturable, "refusals": [r.line() for r in self.check.refusals],
               "refused_calls": self.refused_calls, "schedule": schedule.to_json()}
        if self.graphed is not None:
            out.update(self.graphed.report())
        return out


def graphs_for(mode: str, device: torch.device, trace, program, *, optimizer, inputs: tuple,
               fake: bool) -> CudaGraphs:
    """The CudaGraphs of a step traced as `trace`, compiled into `program`, called with `inputs`."""
    check = check_step(trace, program, optimizer=optimizer, signature=input_signature(inputs), device=device.type)
    return CudaGraphs(mode, device, check, fake=fake)


def changed_inputs(graphs: CudaGraphs, signature: tuple, inputs: tuple) -> None:
    """A call whose input tensors differ from the traced ones: refused by an active graph."""
    if graphs.active:
        refusal = input_change(signature, input_signature(inputs))
        if refusal is not None:
            graphs.refuse_call(refusal)


def on_cuda_runtime(step, cuda, mode: str = "on") -> None:
    """Run OptimizedStep `step` (its tensors on the CPU) as it runs on CUDA with `cuda_graph` `mode`,
    with `cuda` as its CUDA runtime: memplan.testing.cuda_rules' stand-in checks every copy lane,
    event and capture against CUDA's rules. From the next call on; its plan runs anew (re-settled)."""
    check = check_step(step.trace, step.program, optimizer=step.runtime.optimizer, signature=step.signature,
                       device="cpu")  # the stand-in's tensors are on the CPU
    step.graphs = CudaGraphs(mode, torch.device("cuda"), check, cuda=cuda)
    step._run_plan(step.plan)

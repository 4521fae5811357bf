"""A plan lowered onto torch.compile: memplan decides, AOTAutograd's partitioner executes.

Under `torch.compile` what a step keeps for backward is decided by the partitioner that splits
AOTAutograd's joint graph into a forward and a backward: it saves some forward values and
recomputes the rest in the backward graph, honouring a node's `recompute` tag
(`CheckpointPolicy.MUST_RECOMPUTE` / `MUST_SAVE`) as a hard constraint. So a plan is lowered
there (docs/compile.md says why there rather than in checkpoint regions):

1. `CompiledPlan.of` keeps the decisions a compiled step can take, those that take a forward
   activation away until backward needs it: a recomputation, or on a GPU with compile-time
   activation offload, a swap (offloaded to the host and reloaded). The rest are counted.
2. `PlanPartitioner` is Inductor's `custom_partitioner_fn`: for each joint graph it matches the
   graph's forward ops to the trace's (memplan.exec.graph_match), tags the nodes of every op
   that writes a storage the plan recomputes MUST_RECOMPUTE (one it swaps: MUST_SAVE and
   `should_offload`), and calls PyTorch's own min-cut partitioner. What the plan keeps is left
   to it, so it may still recompute what it deems free (fused elementwise ops): it never keeps
   what the plan takes away.
3. `compile_options` puts the partitioner into `torch.compile`'s Inductor options: each plan a
   new backend, so a new plan compiles again and a cached graph is never one of another plan.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
from dataclasses import dataclass, field

import torch
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files
from torch.utils.checkpoint import CheckpointPolicy

from ..errors import MemplanError
from ..model import Action, Plan, Trace
from . import graph_match
from .graph_match import align, graph_ops, trace_ops

log = logging.getLogger(__name__)

OFFLOAD_MODULE = "torch._functorch._activation_offloading"  # compile-time activation offload (torch >= 2.10)
# Why a decision is not lowered (the keys of `CompiledPlan.outside`).
NOT_SAVED = "not a forward activation saved for backward"
NO_OFFLOAD = "a swap, and this step cannot offload (compile-time offload needs CUDA)"
NOT_IN_GRAPH = "its ops are not in a compiled graph (eager code around the model)"
INDUCTOR, AOT_EAGER = "inductor", "aot_eager"  # the backends a plan is lowered onto


def offload_available(device: torch.device) -> bool:
    """Whether a compiled step on `device` can offload activations to the host (CUDA, and a
    PyTorch with compile-time activation offload)."""
    return device.type == "cuda" and importlib.util.find_spec(OFFLOAD_MODULE) is not None


@dataclass(frozen=True, kw_only=True)
class CompiledPlan:
    """A plan's decisions as a compiled step takes them."""

    decisions: tuple[tuple[Action, tuple[int, ...]], ...]  # per lowered decision: its action, the ops writing its storage
    recomputed: frozenset[int] = frozenset()  # storages a lowered decision recomputes
    outside: dict[str, int] = field(default_factory=dict)  # decisions not lowered, by why
    digest: str = ""  # names the plan: a compiled graph is cached under it

    @classmethod
    def of(cls, trace: Trace, plan: Plan, *, offload: bool) -> CompiledPlan:
        """The decisions of `plan` that a compiled step can take; with `offload`, swaps too."""
        lowered, outside, recomputed = [], {}, set()
        for d in plan.decisions:
            why = _not_lowered(trace, d, offload)
            if why:
                outside[why] = outside.get(why, 0) + 1
                continue
            writers = tuple(i for i in trace.writers[d.storage] if i <= d.out_after)
            lowered.append((Action.of(d.action), writers))
            if d.action == Action.RECOMPUTE.word:
                recomputed.add(d.storage)
        text = repr((trace.digest, sorted(lowered)))
        return cls(decisions=tuple(lowered), recomputed=frozenset(recomputed), outside=outside,
                   digest=hashlib.sha256(text.encode()).hexdigest()[:16])

    def actions(self) -> dict[int, str]:
        """Trace op -> what happens to what it writes (Action.RECOMPUTE wins over Action.SWAP)."""
        out: dict[int, str] = {}
        for action, ops in self.decisions:
            for i in ops:
                if out.get(i) != Action.RECOMPUTE:
                    out[i] = action
        return out


def _not_lowered(trace: Trace, d, offload: bool) -> str:
    """Why decision `d` is not lowered onto the partitioner ("" when it is)."""
    if d.wraps or trace.ops[d.out_after].phase != "forward" or trace.ops[d.back_before].phase != "backward":
        return NOT_SAVED
    if d.action == "swap" and not offload:
        return NO_OFFLOAD
    return ""


class PlanPartitioner(CustomPartitionerFn):
    """Inductor's partitioner for one plan: its decisions as recompute tags, then PyTorch's min-cut.

    `report()` says what was lowered, summed over the joint graphs partitioned so far.
    """

    def __init__(self, trace: Trace, compiled: CompiledPlan):
        self.trace = trace
        self.compiled = compiled
        self._actions = compiled.actions()
        self._ops = trace_ops(trace)
        self._taken: set[int] = set()  # trace ops whose nodes were tagged
        self._matched: set[int] = set()  # trace ops found in a graph
        self.graphs = 0  # joint graphs partitioned
        self.saved_bytes = 0  # what the forward graphs save for backward
        self.tagged: set[str] = set()  # names of the nodes tagged MUST_RECOMPUTE
        self.tagged_but_saved = 0  # of them, saved by the partition all the same (never, by min-cut's rule)

    def __call__(self, gm, joint_inputs, **kwargs):
        from torch._functorch import config as functorch_config
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        offloads = self._tag(gm.graph)
        with functorch_config.patch(enable_activation_offloading=True, activation_offload_separate_stream=True,
                                    activation_reload_prefetch=True) if offloads else contextlib.nullcontext():
            fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        saved = _saved(fw, kwargs.get("num_fwd_outputs", 0))
        self.graphs += 1
        self.saved_bytes += _nbytes(saved)
        self.tagged_but_saved += sum(node.name in self.tagged for node in saved)
        return fw, bw

    def _tag(self, graph) -> int:
        """Tag the nodes of the plan's ops in `graph`; the number of offloaded ops."""
        ops = graph_ops(graph)
        offloads = 0
        for j, covered in align(self.trace, self._ops, ops).items():
            self._matched.update(covered)
            acts = {self._actions[i] for i in covered if i in self._actions}
            if not acts:
                continue
            self._taken.update(i for i in covered if i in self._actions)
            if Action.RECOMPUTE in acts:
                for node in ops[j].nodes:
                    node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                    self.tagged.add(node.name)
            else:
                result = ops[j].nodes[-1]  # the op's value: the one saved, and offloaded
                result.meta["recompute"] = CheckpointPolicy.MUST_SAVE
                result.meta["should_offload"] = True
                offloads += 1
        return offloads

    def uuid(self):
        """Compile caches key on the plan and this code: a cached graph is never another plan's."""
        return f"{self.compiled.digest}:{get_hash_for_files((__file__, graph_match.__file__))}"

    def report(self) -> dict:
        """JSON-ready: decisions lowered and not (by why), graphs partitioned, bytes they save."""
        lowered = sum(any(i in self._taken for i in ops) for _, ops in self.compiled.decisions)
        outside = dict(self.compiled.outside)
        if self.graphs and lowered < len(self.compiled.decisions):
            outside[NOT_IN_GRAPH] = len(self.compiled.decisions) - lowered
        return {"decisions_lowered": lowered if self.graphs else 0, "decisions_not_lowered": outside,
                "graphs_partitioned": self.graphs, "saved_bytes": self.saved_bytes,
                "trace_saved_bytes": self.trace_saved_bytes(), "tagged_nodes": len(self.tagged),
                "tagged_but_saved": self.tagged_but_saved}

    def trace_saved_bytes(self) -> int:
        """What the trace says the compiled ops save for backward under the plan: the activations
        autograd saved that ops found in a graph write, less those the plan recomputes. Beside
        `saved_bytes`, what the compiler saves less (or more) than the plan assumed."""
        saved = {s.storage for s in self.trace.saved if s.storage is not None}
        kept = {w for i in self._matched for w in self.trace.ops[i].writes
                if w in saved and self.trace.storages[w].kind == "activation"} - self.compiled.recomputed
        return sum(self.trace.storages[w].nbytes for w in kept)


def compile_options(partitioner: PlanPartitioner, options: dict | None) -> dict:
    """`torch.compile`'s keyword arguments (`options` as a user gives them) with the plan's
    partitioner: among Inductor's options (a mode given as the options it stands for: torch.compile
    takes one or the other), or, for the `aot_eager` backend (AOTAutograd without code generation:
    a debugging backend), as its partition function.

    Raises:
        MemplanError: another backend (its partitioner is not one memplan can give a plan to).
    """
    kwargs = dict(options or {})
    backend = kwargs.pop("backend", INDUCTOR)
    if backend == AOT_EAGER and not {"mode", "options"} & set(kwargs):
        return {**kwargs, "backend": _aot_eager(partitioner)}
    if backend != INDUCTOR:
        raise MemplanError(f"a plan is lowered onto the partitioner of {INDUCTOR!r} (or {AOT_EAGER!r}, without mode "
                           f"and options): backend {backend!r} cannot run it")
    from torch._inductor import list_mode_options

    mode = kwargs.pop("mode", None) or "default"  # torch.compile takes a mode or options, not both: the mode as options
    modal = list_mode_options(mode, kwargs.get("dynamic")) if mode != "default" else {}
    kwargs["options"] = {**modal, **(kwargs.get("options") or {}), "custom_partitioner_fn": partitioner}
    return kwargs


def _aot_eager(partitioner: PlanPartitioner):
    """torch.compile's `aot_eager` backend (AOTAutograd, the graphs run as they are) with `partitioner`."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    return aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=partitioner,
                        keep_inference_input_mutations=True)


def _saved(fw, num_fwd_outputs: int) -> list:
    """The activations a forward graph saves for backward: its outputs after the model's, but its
    inputs (parameters and the step's inputs take no memory of their own)."""
    output = next(n for n in fw.graph.nodes if n.op == "output")
    return [node for node in output.args[0][num_fwd_outputs:] if hasattr(node, "meta") and node.op != "placeholder"]


def _nbytes(nodes: list) -> int:
    """Bytes of the tensors of `nodes` (0 where a size is symbolic)."""
    vals = [node.meta.get("val") for node in nodes]
    try:
        return sum(int(v.numel()) * v.element_size() for v in vals if isinstance(v, torch.Tensor))
    except TypeError:
        return 0

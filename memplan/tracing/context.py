"""Where the traced program is while an op runs: its phase and its owning module.

Forward ops belong to the innermost module whose forward is running (global module
forward hooks); with a `clock`, every module call made while autograd records is kept as a
`Call`, and every gradient accumulated and optimizer step as a `Mark` (memplan.model.hookpoints). Backward ops belong to the module whose forward created the autograd
node that is executing: when a module's forward returns, the nodes it created are
found by walking the autograd graph back from its outputs, and remembered by their
sequence numbers (ints, so no reference keeps a graph or its saved tensors alive).
"""

from __future__ import annotations

import contextlib

import torch

from ..model import Call, Mark
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

# AccumulateGrad nodes carry this sequence number; they are mapped through their parameter.
_ACCUMULATE_SEQ = 2**64 - 1
_NO_GRAPH_TASK = -1


class ProgramContext:
    """Tracks phase and module while installed (use as a context manager).

    Args:
        model: the root module, to name submodules by their path; without it the first
            module called at top level becomes the root.
    """

    def __init__(self, model: torch.nn.Module | None = None, clock=None, storages_of=None):
        self.clock = clock  # () -> (ops, packs) so far: module calls are recorded when given
        self.storages_of = storages_of  # (args, kwargs) -> their tensors' storage ids (a call's `args`)
        self.calls: list[Call] = []  # in the order they returned
        self.marks: list[Mark] = []  # in the order they fired
        self._marked: dict[tuple[str, str], int] = {}  # (kind, key) -> marks so far
        self._param_names: dict[int, tuple[torch.nn.Parameter, str]] = {}  # id -> (parameter, its name)
        self._occurrences: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._modules: list[torch.nn.Module] = []
        self._param_owner: dict[int, str] = {}
        self._stack: list[tuple] = []  # (module path, highest node seq before it ran, occurrence, clock at its start)
        self._node_module: dict[int, str] = {}
        self._optimizer_depth = 0
        self._after_backward = False
        if model is not None:
            self._adopt(model)

    # --- queries -------------------------------------------------------------------------

    def phase(self) -> str:
        """"forward", "backward" or "optimizer" for the op about to be recorded."""
        if self._optimizer_depth:
            return "optimizer"
        if torch._C._current_graph_task_id() != _NO_GRAPH_TASK:
            self._after_backward = True
            return "backward"
        # Gradient clipping and the like, after backward and before the next forward.
        return "optimizer" if self._after_backward else "forward"

    def module(self, phase: str) -> str:
        """Path of the module owning the current op ("" when none)."""
        if phase != "backward":
            return self._stack[-1][0] if self._stack else ""
        node = torch._C._current_autograd_node()
        if node is None:
            return ""
        seq = node._sequence_nr()
        if seq == _ACCUMULATE_SEQ:
            variable = getattr(node, "variable", None)
            return self._param_owner.get(id(variable), "") if variable is not None else ""
        return self._node_module.get(seq, "")

    # --- installation ---------------------------------------------------------------------

    @contextlib.contextmanager
    def installed(self):
        """Install the global module and optimizer hooks for the duration of the block."""
        handles = [register_module_forward_pre_hook(self._pre_forward),
                   register_module_forward_hook(self._post_forward),
                   register_optimizer_step_pre_hook(self._pre_step),
                   register_optimizer_step_post_hook(self._post_step)]
        if self.clock is not None and self.storages_of is not None:  # after the global hook, with kwargs
            handles += [m.register_forward_pre_hook(self._arguments, with_kwargs=True) for m in self._modules]
        if self.clock is not None:
            handles += [p.register_post_accumulate_grad_hook(self._accumulated)
                        for p, _ in self._param_names.values() if p.requires_grad]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    # --- hooks ------------------------------------------------------------------------------

    def _adopt(self, root: torch.nn.Module) -> None:
        for name, mod in root.named_modules():
            if id(mod) not in self._names:
                self._modules.append(mod)
            self._names.setdefault(id(mod), name)
            for param in mod.parameters(recurse=False):
                self._param_owner.setdefault(id(param), name)
        for name, param in root.named_parameters():  # the names Trace.owners gives them (tied ones: the first)
            self._param_names.setdefault(id(param), (param, name))

    def _pre_forward(self, module, args):
        if id(module) not in self._names and not self._stack:
            self._adopt(module)
        name = self._names.get(id(module), type(module).__name__)
        occurrence = self._occurrences.get(name, 0)
        self._occurrences[name] = occurrence + 1
        named = id(module) in self._names  # a module the executor can find again by its path
        start = [*self.clock(), ()] if self.clock is not None and named and torch.is_grad_enabled() else None
        self._stack.append((name, _max_seq(args), occurrence, start))
        self._after_backward = False

    def _post_forward(self, module, args, output):
        if not self._stack:
            return
        name, floor, occurrence, start = self._stack.pop()
        self._claim_nodes(output, name, floor)
        if start is not None:
            end = self.clock()
            self.calls.append(Call(module=name, occurrence=occurrence, first_op=start[0], end_op=end[0],
                                   first_saved=start[1], end_saved=end[1], args=start[2]))

    def _arguments(self, module, args, kwargs):
        """A model module's call: its arguments' storages, on the record the global pre-hook began."""
        start = self._stack[-1][3] if self._stack else None
        if start is not None:
            start[2] = self.storages_of(args, kwargs)

    def _claim_nodes(self, output, name: str, floor: int) -> None:
        """Assign unclaimed autograd nodes created inside this module's forward to it."""
        todo = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            node = todo.pop()
            seq = node._sequence_nr()
            if seq <= floor or seq == _ACCUMULATE_SEQ or seq in self._node_module:
                continue
            self._node_module[seq] = name
            todo.extend(nxt for nxt, _ in node.next_functions if nxt is not None)

    def _pre_step(self, optimizer, args, kwargs):
        self._optimizer_depth += 1
        self._mark("step", "")

    def _post_step(self, optimizer, args, kwargs):
        self._optimizer_depth -= 1
        self._mark("stepped", "")

    def _accumulated(self, param) -> None:
        self._mark("accumulated", self._param_names[id(param)][1])

    def _mark(self, kind: str, key: str) -> None:
        """Record that hook `kind` of `key` fired now."""
        if self.clock is None:
            return
        occurrence = self._marked.get((kind, key), 0)
        self._marked[(kind, key)] = occurrence + 1
        self.marks.append(Mark(kind=kind, key=key, occurrence=occurrence, point=self.clock()[0]))


def _max_seq(args) -> int:
    """Highest sequence number among the inputs' autograd nodes (-1 when none)."""
    seqs = [t.grad_fn._sequence_nr() for t in tree_leaves(args)
            if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    return max(seqs, default=-1)

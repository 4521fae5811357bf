"""The step program indexed by the points of a step where the runner acts."""

from __future__ import annotations

from ..model.program import Action, ActionKind, StepProgram


class ProgramPoints:
    """What the runner does at each op of the step, looked up once per program.

    Attributes:
        at: actions by (op, after), each group in execution order.
        early: per op, the swap-outs after it whose copy starts before it (vDNN's offload
            beside the op: `Decision.overlap`).
        splits: per convolution op the plan splits, the micro-batch sizes of each kernel.
        recomputed_at: per op, the storages recomputed before it.
    """

    def __init__(self, program: StepProgram):
        self.at = program.actions_at()
        self.early = {op: [a for a in acts if a.kind == ActionKind.SWAP_OUT and _beside(program.decisions[a.decision])]
                      for (op, after), acts in self.at.items() if after}
        self.splits = program.splits()
        self.recomputed_at: dict[int, set[int]] = {}
        for a in program.actions:
            if a.kind == ActionKind.RECOMPUTE:
                self.recomputed_at.setdefault(a.op, set()).add(program.decisions[a.decision].storage)

    def busy_ops(self) -> set[int]:
        """Ops with actions or a split convolution."""
        return {op for op, _ in self.at} | set(self.splits)

    def actions(self, op: int, after: bool) -> tuple[Action, ...]:
        """The actions before (or after) op `op`."""
        return self.at.get((op, after), ())


def _beside(d) -> bool:
    """The decision's copy may start with its op: the op only reads it, and it is copied as it is."""
    return d.action == "swap" and d.overlap and d.compress_ratio is None

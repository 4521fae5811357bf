"""The model's blocks: the module calls `torch.utils.checkpoint` users wrap (transformer layers,
residual blocks), found in the trace's module calls (`Trace.calls`).

Descend from the outermost call while only one of its calls has calls of its own (a model whose
body is one module: a transformer's `transformer` or `encoder`); the calls below with calls of
their own are the blocks, and one whose calls all have calls of their own stands for them (a
ResNet stage, a Sequential of blocks). As `memplan.workflows.torch_tools.top_level_blocks` does
with the modules themselves, so a plan over these blocks recomputes what torch-checkpoint does.
"""

from __future__ import annotations

from ...model import Call, Trace


def block_calls(trace: Trace) -> list[Call]:
    """The blocks of the step's forward, in order ([] when the trace records no module calls)."""
    calls = [c for c in trace.calls if c.end_op > c.first_op]
    if not calls:
        return []
    kids = _children(calls)
    node = max(calls, key=lambda c: c.end_op - c.first_op)
    while True:
        big = [k for k in kids[node] if kids[k]]
        if len(big) != 1:
            break
        node = big[0]
    blocks: list[Call] = []
    for k in kids[node]:
        grand = kids[k]
        if len(grand) > 1 and all(kids[g] for g in grand):
            blocks += grand
        elif grand:
            blocks.append(k)
    return blocks


def _children(calls: list[Call]) -> dict[Call, list[Call]]:
    """Each call's calls one level down (by their op ranges)."""
    ordered = sorted(calls, key=lambda c: (c.first_op, -c.end_op))
    kids: dict[Call, list[Call]] = {c: [] for c in ordered}
    stack: list[Call] = []
    for c in ordered:
        while stack and not (stack[-1].first_op <= c.first_op and c.end_op <= stack[-1].end_op):
            stack.pop()
        if stack:
            kids[stack[-1]].append(c)
        stack.append(c)
    return kids

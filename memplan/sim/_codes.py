"""The numbers the simulator's kernel and its callers agree on: decision kinds, wrap modes,
bits, and the slots of the kernel's result vectors and program rows.

Apart from the kernel so that importing them does not import numba (memplan.sim.kernel_loader).
numba caches the compiled kernel by the stamps of its own files (_kernel.py, _events.py), with these
values baked in: a value changed here is seen once those files change too (or their caches in
__pycache__ are removed); the tests compare the compiled kernel with plain Python (tests/sim).
"""

from ..model.plan import Action
from ..model.program import ActionKind

SWAP, RECOMPUTE = int(Action.SWAP), int(Action.RECOMPUTE)  # a decision's kind: numba's copy of memplan.model.Action
NO_WRAP, HEAD_WRAP, TAIL_WRAP = 0, 1, 2
D2H_COPY, H2D_COPY, EXTRA_WORK = 0, 1, 2  # kinds of recorded intervals (third column of `copies`)
SYNC, OVERLAP = 1, 2  # bits of d_sync: the compute stream waits; the copy may start with its op
# Indices into the float result vector.
R_TIME, R_COMPUTE, R_MEM_STALL, R_PREFETCH_STALL, R_RECOMPUTE, R_SYNC_STALL, R_COPY_BUSY, R_HOST = range(8)
N_FLOAT_RESULTS = 8
# Indices into the int result vector.
I_FEASIBLE, I_BAD_OP, I_SHORTFALL, I_PEAK, I_LINK, I_N_LOAD_EVENTS, I_N_HOST_EVENTS, I_N_PROGRAM = range(8)
N_INT_RESULTS = 8
# Step-program actions the kernel emits in execution order: the numbers of memplan.model.program.ActionKind.
A_RELEASE = ActionKind.RELEASE.code
A_PREFETCH = ActionKind.PREFETCH.code
A_RECOMPUTE = ActionKind.RECOMPUTE.code
A_WAIT = ActionKind.WAIT.code
A_SWAP_OUT = ActionKind.SWAP_OUT.code
A_DROP = ActionKind.DROP.code

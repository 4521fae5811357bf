"""Small synthetic traces with known structure, for tests and examples.

`chain_trace` builds the iteration of a plain feed-forward chain of n layers: each
forward op saves its output for the backward pass, each backward op frees the
activation it consumed. No torch needed, so planners and the simulator can be tested
before (and independently of) the tracer.
"""

from __future__ import annotations

from ..model import Op, Storage, Trace
from .lifetimes import access_spans, lifetime

MIB = 2**20


def chain_trace(n_layers: int = 8, act_bytes: int = 64 * MIB, param_bytes: int = 4 * MIB,
                flops_per_layer: float = 2e11, sizes: list[int] | None = None, state_bytes: int = 0) -> Trace:
    """A forward/backward/optimizer iteration of an n-layer chain.

    Args:
        n_layers: number of layers.
        act_bytes: size of every activation (ignored when `sizes` is given).
        param_bytes: size of every layer's weight (and its gradient).
        flops_per_layer: FLOPs of each forward op (backward ops do twice as much).
        sizes: per-layer activation sizes, overriding `act_bytes`.
        state_bytes: when positive, every weight has an optimizer state of this size ("m3"), read and
            written only by its update in the step (a momentum's).
    Returns:
        The trace; storage names say what each one is ("x", "a3", "g3", "w3", "dw3", "m3").
    """
    sizes = sizes or [act_bytes] * n_layers
    b = _Builder()
    x = b.storage("x", sizes[0], "input", pre=True)
    weights = [b.storage(f"w{i}", param_bytes, "param", pre=True, persistent=True) for i in range(n_layers)]
    acts = [x]
    for i in range(n_layers):
        a = b.storage(f"a{i}", sizes[i], "activation")
        b.op("aten.linear", "forward", f"layer{i}", reads=[acts[-1], weights[i]], writes=[a], flops=flops_per_layer)
        acts.append(a)
    grad = b.storage("loss_grad", sizes[-1], "temp")
    b.op("aten.mse_loss_backward", "backward", "loss", reads=[acts[-1]], writes=[grad], flops=0)
    grads = []
    for i in reversed(range(n_layers)):
        g_in = b.storage(f"g{i}", sizes[i - 1] if i else sizes[0], "temp")
        dw = b.storage(f"dw{i}", param_bytes, "grad")
        b.op("aten.linear_backward", "backward", f"layer{i}", reads=[grad, acts[i], weights[i]],
             writes=[g_in, dw], flops=2 * flops_per_layer)
        grad = g_in
        grads.append(dw)
    states = [b.storage(f"m{i}", state_bytes, "optimizer_state", pre=True, persistent=True) if state_bytes else None
              for i in range(n_layers)]
    for i, dw in zip(reversed(range(n_layers)), grads):
        m = [states[i]] if state_bytes else []
        b.op("aten.add_", "optimizer", "", reads=[weights[i], dw] + m, writes=m + [weights[i]], flops=0)
    return b.build(meta={"source": "synthetic", "model": f"chain{n_layers}"})


def residual_trace(n_blocks: int = 3, act_bytes: int = 64 * MIB, param_bytes: int = 4 * MIB,
                   flops_per_block: float = 2e11) -> Trace:
    """The iteration of n residual blocks h_i = h_{i-1} + g(f(h_{i-1})).

    f (a weighted, compute-bound op) makes y_i, saved for backward; g (a cheap elementwise
    op) makes t_i, which only the add reads, so the framework frees it in forward and a
    recomputation of h_i must rebuild it from y_i; h_i is read by the next block and by its
    add (the skip connection).

    Args:
        n_blocks: number of blocks.
        act_bytes: size of every activation.
        param_bytes: size of every block's weight (and its gradient).
        flops_per_block: FLOPs of each f (its backward does twice as much).
    Returns:
        The trace; storage names say what each one is ("h0" is the input, "y2", "t2", "h2").
    """
    b = _Builder()
    hs = [b.storage("h0", act_bytes, "input", pre=True)]
    weights = [b.storage(f"w{i}", param_bytes, "param", pre=True, persistent=True) for i in range(1, n_blocks + 1)]
    ys = []
    for i in range(1, n_blocks + 1):
        y, t, h = (b.storage(f"{name}{i}", act_bytes, kind) for name, kind in
                   (("y", "activation"), ("t", "temp"), ("h", "activation")))
        b.op("aten.linear", "forward", f"block{i}.f", reads=[hs[-1], weights[i - 1]], writes=[y], flops=flops_per_block)
        b.op("aten.gelu", "forward", f"block{i}.g", reads=[y], writes=[t], flops=0)
        b.op("aten.add", "forward", f"block{i}", reads=[t, hs[-1]], writes=[h], flops=0)
        ys.append(y)
        hs.append(h)
    grad = b.storage("loss_grad", act_bytes, "temp")
    b.op("aten.mse_loss_backward", "backward", "loss", reads=[hs[-1]], writes=[grad], flops=0)
    grads = []
    for i in reversed(range(1, n_blocks + 1)):
        g_y, g_f, g_h, dw = (b.storage(name, size, kind) for name, size, kind in
                             ((f"gy{i}", act_bytes, "temp"), (f"gf{i}", act_bytes, "temp"),
                              (f"gh{i - 1}", act_bytes, "temp"), (f"dw{i}", param_bytes, "grad")))
        b.op("aten.gelu_backward", "backward", f"block{i}.g", reads=[grad, ys[i - 1]], writes=[g_y], flops=0)
        b.op("aten.linear_backward", "backward", f"block{i}.f", reads=[g_y, hs[i - 1], weights[i - 1]],
             writes=[g_f, dw], flops=2 * flops_per_block)
        b.op("aten.add", "backward", f"block{i}", reads=[g_f, grad], writes=[g_h], flops=0)
        grad = g_h
        grads.append((i, dw))
    for i, dw in grads:
        b.op("aten.add_", "optimizer", "", reads=[weights[i - 1], dw], writes=[weights[i - 1]], flops=0)
    return b.build(meta={"source": "synthetic", "model": f"residual{n_blocks}"})


class _Builder:
    """Collects storages and ops, then derives lifetimes from first write and last access."""

    def __init__(self):
        self.specs: list[dict] = []
        self.ops: list[dict] = []

    def storage(self, name: str, nbytes: int, kind: str, pre: bool = False, persistent: bool = False) -> int:
        self.specs.append(dict(name=name, nbytes=nbytes, kind=kind, pre=pre, persistent=persistent))
        return len(self.specs) - 1

    def op(self, name: str, phase: str, module: str, reads, writes, flops: float) -> None:
        self.ops.append(dict(name=name, phase=phase, module=module, reads=tuple(reads), writes=tuple(writes),
                             flops=float(flops)))

    def build(self, meta: dict) -> Trace:
        n = len(self.ops)
        first, last = access_spans(self.ops)
        storages = []
        for sid, spec in enumerate(self.specs):
            alloc, free = lifetime(first.get(sid), last.get(sid), n, pre=spec["pre"],
                                   to_end=spec["persistent"] or spec["kind"] == "grad")
            storages.append(Storage(id=sid, nbytes=spec["nbytes"], kind=spec["kind"], alloc_op=alloc,
                                    free_op=free, persistent=spec["persistent"], dtype="float32",
                                    name=spec["name"]))
        sizes = [s.nbytes for s in storages]
        ops = tuple(Op(index=i, bytes_accessed=sum(sizes[s] for s in set(op["reads"] + op["writes"])), **op)
                    for i, op in enumerate(self.ops))
        return Trace(storages=tuple(storages), ops=ops, meta=meta)

"""The Q network of paper 002 (Eq. 1-3) in PyTorch, and its weights file.

structure2vec (Eq. 1), T rounds from s^0 = 0:
    s_v^{t+1} = ReLU(W1 x_v + W2 sum_{u in N(v)} s_u^t + W3 sum_{u in N(v)} ReLU(W4 w(u, v)))
graph state (Eq. 2):  g = [W5 sum_u s_u^T, W6 s_c^T]   (c: the node under execution)
Q value (Eq. 3):      Q(g, s_a) = W7 ReLU([g, W8 s_a^T])
No biases, as in the equations. Because the ReLU in Eq. 3 acts elementwise on the
concatenation, Q splits into W7[:2p] ReLU(g) + W7[2p:] ReLU(W8 s_a); it is computed that
way for every node at once.

Weights files are JSON (never pickle): {"schema": "memplan.dqn-weights", "version": 1,
"dim": p, "rounds": T, "features": 6, "tensors": {"w1": {"shape": [p, 6], "data": [...]}, ...},
"meta": {...}}.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from torch import nn

from ...errors import MemplanError, TraceFormatError
from ...fileio import atomic_write_text
from .graph import N_FEATURES, Graph

WEIGHTS_SCHEMA = "memplan.dqn-weights"
WEIGHTS_VERSION = 1
MAX_DIM = 1024  # a weights file asking for a larger p is refused before anything is allocated
MAX_ROUNDS = 32  # and one asking for more rounds of Eq. 1
DEFAULT_DIM = 16  # p (the paper does not give it; 16 trains four times faster than 32 on a CPU)
DEFAULT_ROUNDS = 4  # T (§4.4.1, after Dai et al. 2017)
_DIGITS = 6  # significant digits kept in the file


class QNet(nn.Module):
    """structure2vec embedding plus the Q head; weights W1..W8 as in the paper."""

    def __init__(self, dim: int = DEFAULT_DIM, rounds: int = DEFAULT_ROUNDS):
        super().__init__()
        self.dim, self.rounds = dim, rounds
        self.w1 = nn.Linear(N_FEATURES, dim, bias=False)
        self.w2 = nn.Linear(dim, dim, bias=False)
        self.w3 = nn.Linear(dim, dim, bias=False)
        self.w4 = nn.Linear(1, dim, bias=False)
        self.w5 = nn.Linear(dim, dim, bias=False)
        self.w6 = nn.Linear(dim, dim, bias=False)
        self.w7 = nn.Linear(3 * dim, 1, bias=False)
        self.w8 = nn.Linear(dim, dim, bias=False)

    def embed(self, tensors: GraphTensors, x: torch.Tensor) -> torch.Tensor:
        """Node states s^T of one graph for a batch of node features x (B, N, 6): (N, B, p)."""
        batch, n, p = x.shape[0], x.shape[1], self.dim
        edge_terms = torch.relu(self.w4(tensors.weight[:, None]))  # (E, p)
        summed = torch.zeros(n, p).index_add_(0, tensors.dst, edge_terms)
        fixed = self.w1(x.transpose(0, 1)) + self.w3(summed)[:, None, :]  # the terms of Eq. 1 fixed over rounds
        s = torch.relu(fixed)  # round 1: s^0 = 0
        for _ in range(self.rounds - 1):
            neighbours = torch.sparse.mm(tensors.adjacency, s.reshape(n, batch * p)).reshape(n, batch, p)
            s = torch.relu(fixed + self.w2(neighbours))
        return s

    def q_values(self, s: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """Q of every node as the action, for node states s (N, B, p) with current nodes (B,): (B, N)."""
        g = torch.cat([self.w5(s.sum(dim=0)), self.w6(s[current, torch.arange(s.shape[1])])], dim=1)
        w7 = self.w7.weight[0]
        return (torch.relu(g) @ w7[:2 * self.dim])[:, None] + (torch.relu(self.w8(s)) @ w7[2 * self.dim:]).T


class GraphTensors:
    """A graph's static tensors: adjacency (self loops included) and edge weights."""

    def __init__(self, graph: Graph):
        n = graph.num_nodes
        edges = torch.as_tensor(graph.edges, dtype=torch.int64)
        self.dst = edges[:, 1].contiguous()
        self.weight = torch.as_tensor(graph.edge_weight, dtype=torch.float32)
        self.adjacency = torch.sparse_coo_tensor(edges.T, torch.ones(len(edges)), (n, n),
                                                 check_invariants=True).coalesce()


# --- weights files --------------------------------------------------------------------------------


def save_weights(net: QNet, path: str | os.PathLike, meta: dict | None = None) -> None:
    """Write the network's weights as JSON, atomically."""
    tensors = {_plain_name(name): {"shape": list(t.shape),
                                   "data": [float(f"{v:.{_DIGITS}g}") for v in t.flatten().tolist()]}
               for name, t in net.state_dict().items()}
    body = {"schema": WEIGHTS_SCHEMA, "version": WEIGHTS_VERSION, "dim": net.dim, "rounds": net.rounds,
            "features": N_FEATURES, "tensors": tensors, "meta": meta or {}}
    atomic_write_text(path, json.dumps(body, separators=(",", ":")) + "\n")


def load_weights(path: str | os.PathLike) -> tuple[QNet, dict]:
    """A QNet with the weights of `path`, and the file's meta.

    Raises:
        MemplanError: the file cannot be read.
        TraceFormatError: it is not JSON, not a weights file, or a tensor is missing,
            misshapen or not finite (naming the file and the field).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MemplanError(f"{path}: cannot read dqn weights: {exc.strerror if isinstance(exc, OSError) else exc}") \
            from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise TraceFormatError(f"{path}: not a dqn weights file (not JSON)") from None
    return _from_json(data, str(path))


def _from_json(data, source: str) -> tuple[QNet, dict]:
    if not isinstance(data, dict) or data.get("schema") != WEIGHTS_SCHEMA:
        raise TraceFormatError(f"{source}: field 'schema': not a memplan dqn weights file")
    if data.get("version") != WEIGHTS_VERSION:
        raise TraceFormatError(f"{source}: field 'version': expected {WEIGHTS_VERSION}, got {data.get('version')!r}")
    if data.get("features") != N_FEATURES:
        raise TraceFormatError(f"{source}: field 'features': expected {N_FEATURES}, got {data.get('features')!r}")
    dim, rounds = data.get("dim"), data.get("rounds")
    if not (_positive_int(dim) and _positive_int(rounds)) or dim > MAX_DIM or rounds > MAX_ROUNDS:
        raise TraceFormatError(f"{source}: fields 'dim' and 'rounds' must be integers in [1, {MAX_DIM}] "
                               f"and [1, {MAX_ROUNDS}]")
    net = QNet(dim, rounds)
    tensors = data.get("tensors")
    if not isinstance(tensors, dict):
        raise TraceFormatError(f"{source}: field 'tensors': expected an object")
    state = {name: _tensor(tensors.get(_plain_name(name)), list(t.shape),
                           f"{source}: field 'tensors.{_plain_name(name)}'")
             for name, t in net.state_dict().items()}
    extra = sorted(set(tensors) - {_plain_name(name) for name in state})
    if extra:
        raise TraceFormatError(f"{source}: field 'tensors': unknown tensor {extra[0]!r}")
    net.load_state_dict(state)
    meta = data.get("meta", {})
    return net, meta if isinstance(meta, dict) else {}


def _tensor(entry, shape: list[int], where: str) -> torch.Tensor:
    if not isinstance(entry, dict) or entry.get("shape") != shape:
        raise TraceFormatError(f"{where}: missing, or its shape is not {shape}")
    values = entry.get("data")
    if not isinstance(values, list) or len(values) != math.prod(shape) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise TraceFormatError(f"{where}: 'data' must hold {math.prod(shape)} finite numbers")
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


def _plain_name(state_name: str) -> str:
    """The paper's name of a weight ("w2") for its state-dict name ("w2.weight")."""
    return state_name.removesuffix(".weight")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0

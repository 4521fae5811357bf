"""Op times for a fake trace: each op timed alone on real random inputs of the traced shapes.

PyTorch's `RuntimeEstimator` ("operator-level-benchmark" mode, torch/distributed/_tools/
runtime_estimator.py) does this under a FakeTensorMode: each fake argument becomes a real tensor
of its shape and dtype on the device it stands for, and the op runs a few times, timed with CUDA
events. memplan's tracer does the same op by op as it records them (`trace(..., time_ops=True)`),
with these differences:

- Identical calls (same overload, same shapes, strides, dtypes and devices of the tensors, same
  other arguments, same tensors passed twice) are timed once: a transformer's layers repeat, and
  a 3,000-op step has a few hundred distinct calls.
- Integer tensors (embedding indices, loss targets) hold values below the smallest dimension of
  any tensor of the call, so they index every tensor of the call in bounds; bool tensors (masks)
  random bits; floating ones uniform in [0, 1), which keeps square roots and logarithms finite.
  Strides are those traced (a channels-last or transposed input stays one), on a buffer just
  large enough for them. Real tensors among the arguments (constants a model keeps) are copied,
  so an in-place op changes nothing of the model.
- The process's random number generators are as they were before each timing: dropout and the
  other random ops draw from them, and the inputs come from private seeded generators.
- The time is the least, over a few rounds, of the mean of back-to-back calls after a warm-up:
  on a GPU (CUDA events on the current stream, which is idle when a round starts) that is the
  kernel's time when the kernel outlasts its launch, else the host's launch work, which is what
  an eager step pays for the op; on the CPU (wall clock) calls are synchronous. The least
  because other work on a shared machine only ever adds time.
- An op that fails alone (a data-dependent kernel that rejects random data, a device out of
  memory) keeps no duration, so the cost model prices it; such ops are counted in the summary.
  Collectives of the data-parallel engines are not timed: the network model prices them.
- An op whose arguments carry a random generator's state (attention backward's `philox_seed` and
  `philox_offset`, flash attention's `rng_state`) is not run at all, and is priced too: outside a
  capture its kernels read that state on the host from where the forward left it, so made-up
  tensors of the traced device can crash the process (an H200 run crashed so, most likely there).
  So is an op that reads a state its forward left or a structure its data has (a cuDNN RNN's
  `dropout_state` and `reserve`, an embedding bag's `offsets` and bags): made-up ones can make
  its kernel write out of bounds, which poisons the device's context for every later op.
- Made-up indices also stay below an int argument that bounds them (`num_weights`, the rows
  embedding backward scatters into).
- The memory an op takes inside itself is measured with the allocator's peak counters; an
  allocator without them (the pool, a pluggable allocator) leaves it unmeasured, the times kept.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import MemplanError
from ..model.trace import ENGINE_OP_PREFIXES

log = logging.getLogger(__name__)

ROUNDS = 3  # timed rounds per distinct call; the least mean is kept
MAX_CALLS = 100  # calls in one round at most
ROUND_S = {"cuda": 1e-3, "cpu": 5e-3}  # a round lasts about this long (short ops are called more often)
MIN_CALL_S = 1e-7  # floor of the first measurement, against a zero elapsed time
SEED = 0  # of the private generators that fill the inputs
GENERATOR_STATE_ARGS = frozenset({"philox_seed", "philox_offset", "rng_state"})  # never made up (module doc)
# What else a kernel reads as its forward or its data made it, never made up (module doc): a cuDNN RNN's
# dropout state and reserve space, an embedding bag's offsets and its bags.
STATE_ARGS = GENERATOR_STATE_ARGS | {"dropout_state", "reserve", "offsets", "offset2bag", "bag_size",
                                     "maximum_indices"}
INDEX_BOUND_ARGS = frozenset({"num_weights"})  # int arguments that bound the call's indices (module doc)


@dataclass(frozen=True, kw_only=True)
class TensorMeta:
    """What a traced tensor argument is made of (its values are not known: it is fake)."""

    shape: tuple[int, ...]  # as traced
    stride: tuple[int, ...]  # as traced (channels-last, transposed and expanded inputs stay so)
    dtype: torch.dtype  # as traced
    device: torch.device  # the device the tensor stands for
    first: int  # position of the first leaf that is this very tensor (aliasing is part of the call)


@dataclass(frozen=True, kw_only=True)
class Call:
    """One op call as recorded before it ran (an in-place view op changes its arguments' shapes)."""

    func: object  # the aten OpOverload
    spec: object  # the pytree structure of (args, kwargs)
    leaves: tuple  # per leaf: a TensorMeta, or the value itself
    real: dict  # leaf position -> a real tensor argument, copied rather than made up

    @property
    def key(self) -> tuple:
        """What makes two calls the same for timing."""
        return self.func, self.spec, self.leaves


class OpBench:
    """Times the ops the tracer records on `device`, one distinct call at a time.

    Args:
        device: the device the trace stands for (its fake tensors' device).
    Raises:
        MemplanError: a CUDA trace on a machine without CUDA.
    """

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise MemplanError(f"timing the ops of a {self.device} trace needs that device: this machine has no CUDA")
        if self.device.type not in ROUND_S:
            raise MemplanError(f"ops can be timed on cpu or cuda, not {self.device.type}")
        self._cache: dict[tuple, float | None] = {}
        self._times: dict[int, float | None] = {}
        self._inner_cache: dict[tuple, int] = {}  # CUDA: bytes a call allocates inside itself
        self._inner: dict[int, int] = {}
        self._failed: Counter = Counter()
        self._not_run: Counter = Counter()  # ops with a forward's state among their arguments (STATE_ARGS)
        self._stats: bool | None = None  # whether the CUDA allocator keeps peak counters (asked at the first op)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._seconds = 0.0

    def call(self, func, args: tuple, kwargs: dict) -> Call | None:
        """The call about to run, or None for an op that is not timed (a collective)."""
        if str(func).startswith(ENGINE_OP_PREFIXES):
            return None
        if _reads_state(func, args, kwargs):
            self._not_run[str(func)] += 1
            return None
        leaves, spec = tree_flatten((args, kwargs))
        seen: dict[int, int] = {}
        metas, real = [], {}
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                first = seen.setdefault(id(leaf), i)
                metas.append(TensorMeta(shape=tuple(leaf.shape), stride=tuple(leaf.stride()), dtype=leaf.dtype,
                                        device=leaf.device, first=first))
                if not isinstance(leaf, FakeTensor):
                    real[i] = leaf
            else:
                metas.append(leaf if _hashable(leaf) else repr(leaf))
        return Call(func=func, spec=spec, leaves=tuple(metas), real=real)

    def time(self, index: int, call: Call) -> None:
        """Give op `index` the time of `call`, measuring it when no identical call was timed yet."""
        key = call.key
        if key not in self._cache:
            started = time.perf_counter()
            self._cache[key] = self._measure(call)
            self._seconds += time.perf_counter() - started
        self._times[index] = self._cache[key]
        if self._inner_cache.get(key):
            self._inner[index] = self._inner_cache[key]

    def inner_bytes(self) -> dict[int, int]:
        """Op index -> bytes the op allocated inside itself and freed before it returned (CUDA only:
        the caching allocator's peak during one call beyond its inputs and new outputs)."""
        return dict(self._inner)

    def durations(self, n: int) -> list[float | None]:
        """Seconds per op for ops 0..n-1 (None: not timed)."""
        return [self._times.get(i) for i in range(n)]

    def summary(self) -> dict:
        """What the timing did, JSON-ready (for the trace's meta)."""
        out = {"source": "op-benchmark", "device": str(self.device), "distinct_calls": len(self._cache),
               "timed_ops": sum(t is not None for t in self._times.values()), "seconds": round(self._seconds, 3),
               "failed": dict(sorted(self._failed.items())), "not_run": dict(sorted(self._not_run.items()))}
        if self._stats is False:
            out["inner_memory"] = "the allocator keeps no statistics"
        return out

    def _measure(self, call: Call) -> float | None:
        name = str(call.func)
        devices = [torch.cuda.current_device()] if self._cuda else []
        try:
            with no_dispatch(), torch.random.fork_rng(devices=devices):
                args, kwargs = self._materialize(call)
                seconds = least_mean_s(self._timer(lambda: call.func(*args, **kwargs)), ROUND_S[self.device.type])
                if self._cuda and self._statistics():  # after the timing's warm-up: handles and workspaces exist
                    self._inner_cache[call.key] = inner_memory(lambda: call.func(*args, **kwargs))
                return seconds
        except Exception as exc:  # noqa: BLE001 - any kernel may reject made-up data; the op is priced instead
            log.debug("op %s could not be timed alone: %s", name, exc)
            self._failed[name] += 1
            return None

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def _statistics(self) -> bool:
        """Whether the CUDA allocator keeps peak counters (a pluggable one, the pool, keeps none): asked once."""
        if self._stats is None:
            try:
                torch.cuda.memory_stats()
                self._stats = True
            except RuntimeError:
                self._stats = False
        return self._stats

    def _timer(self, fn: Callable[[], object]) -> Callable[[int], float]:
        return cuda_timer(fn) if self._cuda else wall_timer(fn)

    def _materialize(self, call: Call) -> tuple[tuple, dict]:
        args, kwargs = tree_unflatten(list(call.leaves), call.spec)
        bound = min([index_bound(call.leaves), *int_bounds(call.func, args, kwargs)])
        made: dict[int, torch.Tensor] = {}
        leaves = []
        for i, meta in enumerate(call.leaves):
            if not isinstance(meta, TensorMeta):
                leaves.append(meta)
            elif meta.first != i:
                leaves.append(made[meta.first])
            else:
                made[i] = call.real[i].clone() if i in call.real else random_tensor(meta, bound, self._generator(meta))
                leaves.append(made[i])
        return tree_unflatten(leaves, call.spec)

    def _generator(self, meta: TensorMeta) -> torch.Generator:
        if meta.device not in self._generators:
            self._generators[meta.device] = torch.Generator(device=meta.device).manual_seed(SEED)
        return self._generators[meta.device]


def _named(func, args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """The call's arguments by their schema's names (none for a function without one)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    return [*zip((a.name for a in schema.arguments), args), *kwargs.items()]


def _reads_state(func, args: tuple, kwargs: dict) -> bool:
    """Whether a tensor argument of `func` is a state its forward left or its data's structure (STATE_ARGS)."""
    return any(name in STATE_ARGS and isinstance(value, torch.Tensor) for name, value in _named(func, args, kwargs))


def int_bounds(func, args: tuple, kwargs: dict) -> list[int]:
    """The int arguments of a call that bound its indices (INDEX_BOUND_ARGS)."""
    return [v for name, v in _named(func, args, kwargs) if name in INDEX_BOUND_ARGS and isinstance(v, int) and v > 0]


def index_bound(leaves: tuple) -> int:
    """The bound of made-up integer values: the smallest non-zero dimension of any tensor of the
    call (an index below it is in bounds for every tensor of the call), at least 1."""
    sizes = [n for m in leaves if isinstance(m, TensorMeta) for n in m.shape if n > 0]
    return max(min(sizes, default=1), 1)


def random_tensor(meta: TensorMeta, bound: int, generator: torch.Generator) -> torch.Tensor:
    """A real tensor with `meta`'s shape, strides, dtype and device, filled as the module doc says."""
    extent = 1 + sum((n - 1) * s for n, s in zip(meta.shape, meta.stride)) if all(meta.shape) else 0
    flat = torch.empty(extent, dtype=meta.dtype, device=meta.device)
    try:
        if meta.dtype.is_floating_point:
            flat.uniform_(generator=generator)
        elif meta.dtype == torch.bool:
            flat.random_(0, 2, generator=generator)
        elif not meta.dtype.is_complex:
            flat.random_(0, bound, generator=generator)
        else:
            flat.zero_()
    except (RuntimeError, NotImplementedError):  # a dtype without a random kernel (float8, ...)
        flat.zero_()
    return flat.as_strided(meta.shape, meta.stride)


def inner_memory(fn: Callable[[], object]) -> int:
    """Bytes one call of `fn` (a CUDA op) allocates beyond what it returns: its peak less the
    memory before it and the blocks of the new outputs it returns (memplan.model.blocks)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    peak = torch.cuda.max_memory_allocated()
    kept = torch.cuda.memory_allocated() - before  # what the call still holds: its outputs
    del out
    return max(0, peak - before - kept)


def least_mean_s(timed: Callable[[int], float], round_s: float) -> float:
    """Least mean seconds per call over ROUNDS rounds, after a warm-up call.

    Args:
        timed: runs the op n times and returns the seconds they took.
        round_s: about how long one round should last.
    """
    timed(1)  # warm-up: lazy initialisation, autotuning, caches
    first = timed(1)
    calls = max(1, min(MAX_CALLS, int(round_s / max(first, MIN_CALL_S))))
    return min([first] + [timed(calls) / calls for _ in range(ROUNDS)])


def wall_timer(fn: Callable[[], object]) -> Callable[[int], float]:
    """`timed(n)` for CPU ops: wall seconds of n calls (CPU ops are synchronous)."""
    def timed(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - start

    return timed


def cuda_timer(fn: Callable[[], object]) -> Callable[[int], float]:
    """`timed(n)` for GPU ops: seconds between CUDA events around n calls on the current stream,
    which is idle when they start (so launch work that outlasts the kernels is counted)."""
    def timed(n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3  # events report milliseconds

    return timed


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True

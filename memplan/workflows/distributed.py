"""One rank of a data-parallel job: wrap a workload in DDP or FSDP2 and trace it without a cluster.

The engines are PyTorch's own (`DistributedDataParallel`, `fully_shard`): memplan composes with
them. Without a cluster, the process group is PyTorch's fake one (`FakeStore` and the "fake"
backend from `torch.testing._internal.distributed.fake_pg`): every collective returns at once
and moves nothing, so one process traces rank 0 of a job of any world size; with fake tensors
nothing is allocated either. The collectives still run through the dispatcher, so the tracer
records them as ops (`c10d._allgather_base_`, `c10d._reduce_scatter_base_`, `c10d.allreduce_`)
with the buffers they read and write.

NOTE: what fake tracing has to work around (cited as [n] below):
[1] The device mesh is made outside the fake mode: `init_device_mesh` reads tensor values.
[2] DDP's constructor checks parameter shapes across ranks, reading data; with fake tensors it
    is skipped (every rank builds the same model, so there is nothing to check).
[3] DDP puts every gradient in one bucket until the first iteration has run, then rebuilds
    buckets by size (1 MiB first, then 25 MiB) in the order gradients became ready, syncing the
    bucket order across ranks (a data read). Under fake tensors DDP is given those sizes from the
    start (`bucket_cap_mb_list`) and the rebuild is turned off (`_FixedBuckets`): the trace has
    a real job's buckets, in reverse parameter order rather than gradient-ready order.
[4] The C++ reducer's default all-reduce hook returns a future that the fake backend completes
    with no tensor; a Python hook that averages, all-reduces and returns the bucket does the
    same work in the trace.
[5] FSDP2 shards each block (every child of an `nn.ModuleList` or `nn.Sequential` that holds
    parameters; without such containers, each direct child with parameters), then the root,
    as the FSDP2 examples do; inner modules first, since a sharded module's parameters are
    already DTensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as ddp_module
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from .. import zoo
from ..errors import MemplanError, about_model, model_code
from ..tracing.collectives import collective_records
from ..tracing.fake import new_fake_mode, quiet_fake_warnings
from ..tracing.tracer import trace

log = logging.getLogger(__name__)

ENGINES = ("ddp", "fsdp")
FAKE_BACKEND = "fake"
_CONTAINERS = (nn.ModuleList, nn.Sequential)
DDP_BUCKET_MIB = (1, 25)  # DDP's rebuilt buckets: a small first one, then bucket_cap_mb each


def check_world_size(world_size) -> int:
    """The world size, or a MemplanError for anything but a positive integer."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise MemplanError(f"world size must be a positive integer, got {world_size!r}")
    return world_size


def check_engine(engine: str) -> str:
    """The engine name, or a MemplanError listing the known ones."""
    if engine not in ENGINES:
        raise MemplanError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return engine


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """A default process group of `world_size` ranks whose collectives move nothing (this is rank `rank`).

    Raises:
        MemplanError: a bad world size, or a default process group already exists.
    """
    check_world_size(world_size)
    if dist.is_initialized():
        raise MemplanError("a torch.distributed process group is already initialised in this process")
    dist.init_process_group(FAKE_BACKEND, store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards on their own before the root, innermost first (NOTE [5])."""
    units = [child for module in model.modules() if isinstance(module, _CONTAINERS) and module is not model
             for child in module.children() if _has_params(child)]
    if not units:
        units = [child for child in model.children() if _has_params(child)]
    inside = {id(m) for unit in units for m in unit.modules() if m is not unit}
    return [unit for unit in reversed(units) if id(unit) not in inside]


def _has_params(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def wrap_model(model: nn.Module, engine: str, *, fake: bool, mesh=None) -> nn.Module:
    """`model` under DDP or FSDP2 on the default process group.

    Args:
        model: the model (its parameters on the device the job uses).
        engine: "ddp" or "fsdp".
        fake: the model's tensors are fake (see the NOTE for what changes).
        mesh: the FSDP2 device mesh (default: one of the whole world, made here).
    Returns:
        The wrapped model (DDP: a new module; FSDP2: `model` itself, its parameters sharded).
    Raises:
        MemplanError: a model without trainable parameters cannot be sharded or replicated.
    """
    check_engine(engine)
    if model is None or not _has_params(model):
        raise MemplanError(f"this model cannot be wrapped in {engine.upper()}: it has no trainable parameters")
    if engine == "ddp":
        return _ddp(model, fake)
    from torch.distributed.fsdp import fully_shard  # half a second to import: only an FSDP2 job pays for it

    mesh = mesh if mesh is not None else _world_mesh(model)
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _world_mesh(model: nn.Module):
    device = next(model.parameters()).device.type
    with unset_fake_temporarily():  # NOTE [1]
        return init_device_mesh(device, (dist.get_world_size(),))


def _ddp(model: nn.Module, fake: bool) -> nn.Module:
    if not fake:
        return DistributedDataParallel(model)
    check = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None  # NOTE [2]
    try:
        wrapped = DistributedDataParallel(model, init_sync=False, bucket_cap_mb_list=list(DDP_BUCKET_MIB))
    finally:
        ddp_module._verify_param_shape_across_processes = check
    wrapped.register_comm_hook(None, _allreduce_hook)  # NOTE [4]
    wrapped.reducer = _FixedBuckets(wrapped.reducer)  # NOTE [3]
    return wrapped


class _FixedBuckets:
    """DDP's reducer, seen from Python, with bucket rebuilding turned off (NOTE [3])."""

    def __init__(self, reducer):
        self._reducer = reducer

    def __getattr__(self, name):
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def _allreduce_hook(state, bucket):  # no annotation: DDP checks it, and ours are strings
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    dist.all_reduce(buffer)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def wrap_workload(workload, engine: str, *, fake: bool):
    """The workload with its model under `engine` and a new optimizer over the wrapped parameters.

    The optimizer (same class, same hyper-parameters) is built again because FSDP2 replaces each
    parameter by its shard (a DTensor).
    """
    if getattr(workload, "model", None) is None or workload.optimizer is None:
        raise MemplanError(f"model {workload.name!r} cannot be wrapped in {engine.upper()}: "
                           "it is a step function without a model and optimizer")
    model = wrap_model(workload.model, engine, fake=fake)
    optimizer = type(workload.optimizer)(model.parameters(), **workload.optimizer.defaults)
    return dataclasses.replace(workload, model=model, optimizer=optimizer)


def trace_rank(name: str, batch: int, engine: str, world_size: int, *, warmup: int = 1, progress=None,
               **config):
    """Trace rank 0 of a `world_size`-rank DDP or FSDP2 job of zoo model `name`, fake tensors, fake group.

    Args:
        name: a zoo name (hf:, tv:, module:function included).
        batch: batch size per rank.
        engine: "ddp" or "fsdp".
        world_size: ranks in the job.
        warmup, progress: as for `memplan.tracing.tracer.trace`.
        config: model options.
    Returns:
        The Trace of one rank; its meta has `engine`, `world_size` and `collectives` (see
        `memplan.tracing.collectives.collective_records`).
    Raises:
        MemplanError: bad world size or engine, or a model that cannot be wrapped.
    """
    check_engine(engine)
    check_world_size(world_size)
    with fake_process_group(world_size), new_fake_mode(), quiet_fake_warnings(), \
            about_model(f"{name} under {engine.upper()}", config):
        workload = zoo.get_workload(name, batch, **config)
        with model_code(f"cannot be wrapped by {engine.upper()}"):
            workload = wrap_workload(workload, engine, fake=True)
        meta = {"model": name, "batch": batch, "config": dict(workload.config), "engine": engine,
                "world_size": world_size}
        result = trace(workload.step, *workload.inputs, fake=True, model=workload.model,
                       optimizer=workload.optimizer, warmup=warmup, progress=progress, meta=meta)
    return dataclasses.replace(result, meta={**result.meta, "collectives": collective_records(result)})

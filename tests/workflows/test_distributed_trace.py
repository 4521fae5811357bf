"""Tracing one rank of a DDP / FSDP2 job with fake tensors and PyTorch's fake process group."""

import json

import pytest
import torch
from torch import nn

from memplan.cli import main
from memplan.errors import MemplanError
from memplan.tracing.collectives import collective_totals
from memplan.tracing.io import read_trace
from memplan.workflows.distributed import shard_units, trace_rank, wrap_model
from memplan.zoo.workload import Workload

MLP = "tests.workflows.test_distributed_trace:mlp_workload"  # the repository root is on sys.path under pytest
WIDTH = 64
FLOAT = 4


def mlp_workload(batch, input_size=None, device="cpu", seed=0):
    """A 3-layer MLP (two Linear+ReLU blocks and a head) trained with SGD + momentum."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()),
                          nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()), nn.Linear(WIDTH, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs = (torch.randn(batch, WIDTH), torch.randint(0, 8, (batch,)))
    return Workload(name="mlp", model=model, optimizer=optimizer, inputs=inputs, batch=batch, input_size=None,
                    device=torch.device(device), seed=seed, config={},
                    loss_fn=lambda m, x, y: nn.functional.cross_entropy(m(x), y))


def paramless(batch):
    """A step function without a model: nothing to replicate or shard."""
    x = torch.randn(batch, 4, requires_grad=True)
    return (lambda t: (t * 2).sum().backward()), (x,)


PARAM_BYTES = (2 * (WIDTH * WIDTH + WIDTH) + WIDTH * 8 + 8) * FLOAT


@pytest.fixture(scope="module")
def ddp_trace():
    return trace_rank(MLP, 4, "ddp", 8)


@pytest.fixture(scope="module")
def fsdp_trace():
    return trace_rank(MLP, 4, "fsdp", 8)


def test_ddp_all_reduces_every_gradient_byte_once(ddp_trace):
    totals = collective_totals(ddp_trace)
    assert totals["all_reduce"]["bytes"] == PARAM_BYTES  # one bucket set covering all gradients
    assert all(r["phase"] == "backward" for r in ddp_trace.meta["collectives"] if r["kind"] == "all_reduce")
    assert ddp_trace.meta["engine"] == "ddp" and ddp_trace.meta["world_size"] == 8


def test_fsdp_gathers_in_both_passes_and_reduce_scatters_gradients(fsdp_trace):
    records = fsdp_trace.meta["collectives"]
    gathers = [r for r in records if r["kind"] == "all_gather"]
    scatters = [r for r in records if r["kind"] == "reduce_scatter"]
    assert {r["phase"] for r in gathers} == {"forward", "backward"}  # re-gathered for backward
    assert len(scatters) == 3 and {r["phase"] for r in scatters} == {"backward"}
    # Each reduce-scatter takes one unit's whole gradient (padded to a multiple of the world size).
    assert PARAM_BYTES <= sum(r["bytes"] for r in scatters) <= PARAM_BYTES + 3 * 2 * 8 * FLOAT


def test_fsdp_shards_optimizer_state_across_ranks(ddp_trace, fsdp_trace):
    replicated = ddp_trace.bytes_by_kind()["optimizer_state"]
    sharded = fsdp_trace.bytes_by_kind()["optimizer_state"]
    assert replicated == PARAM_BYTES
    assert replicated / 8 <= sharded <= replicated / 8 + 6 * 8 * FLOAT  # one shard per rank, padding


def test_shard_units_are_the_blocks_innermost_first():
    blocks = [nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)) for _ in range(2)]
    model = nn.Sequential(nn.ModuleList(blocks), nn.Linear(2, 1))
    units = shard_units(model)
    assert units[:2] == blocks[::-1] or set(map(id, units)) >= set(map(id, blocks))
    assert all(not any(u is not v and any(m is u for m in v.modules()) for v in units) for u in units)


def test_cli_traces_a_rank_and_reports_collectives(capsys, tmp_path):
    out = tmp_path / "fsdp.jsonl"
    rc = main(["trace", MLP, "--batch", "4", "--fsdp", "--world-size", "64", "-o", str(out), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["meta"]["world_size"] == 64
    tr = read_trace(out)
    assert collective_totals(tr)["reduce_scatter"]["count"] == 3
    assert any(op.name == "c10d._allgather_base_.default" for op in tr.ops)


@pytest.mark.parametrize("argv, message", [
    (["--fsdp", "--world-size", "0"], "world size must be a positive integer"),
    (["--ddp"], "--ddp needs --world-size"),
    (["--world-size", "4"], "--world-size needs --ddp or --fsdp"),
])
def test_cli_rejects_bad_distributed_options(capsys, tmp_path, argv, message):
    out = tmp_path / "x.jsonl"
    rc = main(["trace", MLP, "--batch", "2", *argv, "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1 and not out.exists()


def test_a_model_without_parameters_cannot_shard(capsys, tmp_path):
    out = tmp_path / "x.jsonl"
    rc = main(["trace", "tests.workflows.test_distributed_trace:paramless", "--batch", "2", "--fsdp", "--world-size", "2",
               "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "cannot be wrapped in FSDP" in err and len(err.splitlines()) == 1 and not out.exists()
    with pytest.raises(MemplanError, match="no trainable parameters"):
        wrap_model(nn.ReLU(), "ddp", fake=True)


def test_fsdp_unsharded_parameters_live_only_around_their_block(fsdp_trace):
    # FSDP2 frees them by resizing their storage to 0; each all-gather fills a fresh allocation.
    n = len(fsdp_trace.ops)
    gathered = [fsdp_trace.storages[sid] for r in fsdp_trace.meta["collectives"] if r["kind"] == "all_gather"
                for sid in fsdp_trace.ops[r["op"]].writes]
    assert len({s.id for s in gathered}) == len(gathered)  # one allocation per all-gather
    assert all(s.free_op < n for s in gathered)  # every one freed before the step ends
    assert fsdp_trace.bytes_by_kind()["param"] < PARAM_BYTES / 2  # what persists is the shard


def test_the_engines_storages_are_never_planned(fsdp_trace):
    from memplan.model import Decision, Plan
    from memplan.sim.validate import ENGINE_OWNED, validate

    gather = next(r for r in fsdp_trace.meta["collectives"] if r["kind"] == "all_gather")
    owned = fsdp_trace.ops[gather["op"]].writes[0]
    assert owned in fsdp_trace.engine_owned and not fsdp_trace.recomputable(owned)
    s = fsdp_trace.storages[owned]
    swap = Decision(storage=owned, action="swap", out_after=s.alloc_op, back_before=s.free_op - 1)
    kinds = {v.kind for v in validate(fsdp_trace, Plan(decisions=(swap,), planner="test"))}
    assert ENGINE_OWNED in kinds
    # A Linear's output reads the unsharded weight FSDP2 frees after forward: not recomputable.
    addmm = next(op for op in fsdp_trace.ops if op.name == "aten.addmm.default" and op.phase == "forward")
    assert not fsdp_trace.recomputable(addmm.writes[0])


@pytest.mark.parametrize("planner", ["save-on-cpu", "tflms", "sqrt-n", "capuchin", "autoswap:doa"])
def test_planners_leave_the_engines_storages_alone(fsdp_trace, ddp_trace, planner):
    from memplan.planners.base import plan
    from memplan.sim.validate import validate

    for trace in (fsdp_trace, ddp_trace):
        made = plan(trace, "100%", planner=planner, seed=0, **({"min_bytes": 0} if planner == "autoswap:doa" else {}))
        assert validate(trace, made) == []
        assert not {d.storage for d in made.decisions} & trace.engine_owned


def test_simulate_reports_communication_for_a_rank_trace(capsys, tmp_path):
    out = tmp_path / "ddp.jsonl"
    assert main(["trace", MLP, "--batch", "4", "--ddp", "--world-size", "16", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(out), "--profile", "a100", "--json"]) == 0
    comm = json.loads(capsys.readouterr().out)["communication"]
    # 16 ranks are two 8-GPU nodes: the all-reduces cross InfiniBand; each bucket is one collective.
    assert comm["link"] == "ib-hdr" and comm["world_size"] == 16
    assert comm["collectives"] == len(read_trace(out).meta["collectives"])
    assert comm["iteration_s"] >= comm["compute_s"] and comm["comm_s"] > 0

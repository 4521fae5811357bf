"""`memplan fit`: the largest batch per rank of a DDP/FSDP2 job per planner."""

import json

import pytest

from memplan.cli import main
from memplan.cost.profiles import get_profile, profile_to_json, with_overrides
from memplan.workflows.distributed import trace_rank
from memplan.workflows.fit import breakdown_at_peak, fit

MLP = "tests.workflows.test_distributed_trace:mlp_workload"
WORLD = 4


@pytest.fixture(scope="module")
def small_gpu(tmp_path_factory):
    """An H100 profile whose memory holds the MLP's rank at batch 12 but not far beyond."""
    memory = trace_rank(MLP, 12, "fsdp", WORLD).peak_load_bytes
    path = tmp_path_factory.mktemp("fit") / "small.json"
    path.write_text(json.dumps(profile_to_json(with_overrides(get_profile("h100"), name="small", memory_bytes=memory))))
    return path, memory


def test_unplanned_batch_is_the_largest_whose_trace_fits(small_gpu):
    path, memory = small_gpu
    out = fit(MLP, WORLD, str(path), planners=("none",), limit=64)
    row = out["planners"][0]
    best = row["max_batch"]
    assert best >= 12 and out["memory_bytes"] == memory
    assert trace_rank(MLP, best, "fsdp", WORLD).peak_load_bytes <= memory
    assert trace_rank(MLP, best + 1, "fsdp", WORLD).peak_load_bytes > memory
    assert row["samples_per_s"] == pytest.approx(best * WORLD / row["iteration_s"])
    assert row["link"] == "nvlink4"  # 4 ranks fit in one node


def test_breakdown_adds_up_to_the_peak():
    trace = trace_rank(MLP, 4, "ddp", WORLD)
    parts = breakdown_at_peak(trace)
    assert sum(parts.values()) == trace.peak_load_bytes
    assert parts["communication_buffers"] > 0 and parts["parameters"] > 0


def test_cli_fit_json_and_errors(capsys, small_gpu):
    path, _ = small_gpu
    rc = main(["fit", MLP, "--world-size", str(WORLD), "--profile", str(path), "--planners", "none,sqrt-n",
               "--limit", "32", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["planner"] for r in out["planners"]] == ["none", "sqrt-n"]
    for argv, message in ((["--world-size", "0"], "world size must be a positive integer"),
                          (["--world-size", "2", "--planners", "nope"], "unknown planner 'nope'")):
        rc = main(["fit", MLP, *argv])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and len(err.splitlines()) == 1

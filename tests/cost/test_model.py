"""The roofline prices each op at the peak of its precision: TF32 as the trace's math settings say,
BF16/FP16 by dtype; traces and profiles written before these settings existed still load."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from memplan.cost.model import Cost
from memplan.cost.profiles import DeviceProfile, get_profile, profile_to_json
from memplan.model import Op, Storage, Trace
from memplan.tracing.io import read_trace, write_trace
from memplan.workflows.workloads import trace_workload

RESULTS = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "results"
FLOPS = 8e12  # of every op below: compute-bound on the test profile
# Round numbers, efficiencies 1, a memory so fast that only FLOPs count, no launch cost.
PROFILE = DeviceProfile(name="test", description="test", fp32_flops=1e12, tf32_flops=8e12, bf16_flops=16e12,
                        fp16_flops=32e12, memory_bytes=2**34, hbm_bytes_per_s=1e18, h2d_bytes_per_s=1e10,
                        d2h_bytes_per_s=1e10, launch_s=0.0, compute_efficiency=1.0, memory_efficiency=1.0)
FP32_S, TF32_S, BF16_S, FP16_S = 8.0, 1.0, 0.5, 0.25  # FLOPS at each peak
ALL_OFF = {"matmul_tf32": False, "cudnn_tf32": False, "float32_matmul_precision": "highest", "autocast_dtype": None}


def _trace(meta: dict, dtype: str = "float32") -> Trace:
    """A matmul, a convolution and its backward, an elementwise add: each writes one `dtype` storage."""
    names = ["aten.mm.default", "aten.convolution.default", "aten.convolution_backward.default", "aten.add.Tensor"]
    storages = tuple(Storage(id=i, nbytes=1024, kind="activation", alloc_op=i, free_op=len(names), dtype=dtype)
                     for i in range(len(names)))
    ops = tuple(Op(index=i, name=n, phase="forward", writes=(i,), flops=FLOPS if n != "aten.add.Tensor" else 0.0,
                   bytes_accessed=1024) for i, n in enumerate(names))
    return Trace(storages=storages, ops=ops, meta=meta)


@pytest.mark.parametrize("matmul, cudnn, expected", [
    (False, False, [FP32_S, FP32_S, FP32_S]),
    (True, False, [TF32_S, FP32_S, FP32_S]),  # torch.backends.cuda.matmul.allow_tf32 = True
    (False, True, [FP32_S, TF32_S, TF32_S]),  # PyTorch's default: cuDNN convolutions in TF32
    (True, True, [TF32_S, TF32_S, TF32_S])])
def test_fp32_ops_are_priced_at_the_peak_the_math_settings_allow(matmul, cudnn, expected):
    meta = {"math": {**ALL_OFF, "matmul_tf32": matmul, "cudnn_tf32": cudnn}}
    durations = Cost.for_trace(_trace(meta), PROFILE).durations
    assert list(durations[:3]) == pytest.approx(expected)
    assert durations[3] == pytest.approx(1024 / 1e18)  # no FLOPs: memory-bound, whatever the flags


@pytest.mark.parametrize("dtype, seconds", [("bfloat16", BF16_S), ("float16", FP16_S)])
def test_16_bit_ops_are_priced_at_their_own_peak_whatever_the_flags(dtype, seconds):
    durations = Cost.for_trace(_trace({"math": ALL_OFF}, dtype), PROFILE).durations
    assert list(durations[:3]) == pytest.approx([seconds] * 3)


def test_an_explicit_allow_tf32_overrides_the_trace():
    assert list(Cost.for_trace(_trace({"math": ALL_OFF}), PROFILE, allow_tf32=True).durations[:3]) == \
        pytest.approx([TF32_S] * 3)
    tf32_everywhere = {"math": {**ALL_OFF, "matmul_tf32": True, "cudnn_tf32": True}}
    assert list(Cost.for_trace(_trace(tf32_everywhere), PROFILE, allow_tf32=False).durations[:3]) == \
        pytest.approx([FP32_S] * 3)


def test_a_trace_file_without_math_settings_loads_and_is_priced_in_fp32(tmp_path):
    path = tmp_path / "old.jsonl"
    write_trace(_trace({"source": "tracer", "model": "old"}), path)
    header = json.loads(path.read_text().splitlines()[0])
    assert "math" not in header["meta"]  # as every trace written before the settings were recorded
    old = read_trace(path)
    assert list(Cost.for_trace(old, PROFILE).durations[:3]) == pytest.approx([FP32_S] * 3)


def test_a_profile_file_without_fp16_loads_and_prices_fp16_at_the_bf16_peak(tmp_path):
    committed = RESULTS / "sim_error_cpu_profile.json"  # written by `calibrate --device cpu` before fp16_flops
    assert "fp16_flops" not in json.loads(committed.read_text())
    assert get_profile(str(committed)).fp16_flops is None
    data = {k: v for k, v in profile_to_json(PROFILE).items() if k != "fp16_flops"}
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = get_profile(str(tmp_path / "old.json"))
    assert old.fp16_flops is None and old.peak_flops("float16") == PROFILE.bf16_flops


def test_pre_ampere_profiles_have_fp16_tensor_cores_and_no_bf16_ones():
    v100 = get_profile("v100")
    assert v100.peak_flops("float16") == pytest.approx(125e12) and v100.peak_flops("bfloat16") == v100.fp32_flops
    assert get_profile("h100").peak_flops("float16") == get_profile("h100").peak_flops("bfloat16")


@pytest.fixture
def matmul_tf32_on():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_tracer_records_the_settings_in_force(matmul_tf32_on):
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False):
        tr = trace_workload("transformer-encoder", 2, fake=True, seq_len=16, num_layers=1)
    assert tr.meta["math"] == {"matmul_tf32": True, "cudnn_tf32": False, "float32_matmul_precision": "high",
                               "autocast_dtype": None}
    mm = [op.index for op in tr.ops if op.name in ("aten.mm.default", "aten.addmm.default") and op.flops > 0]
    h100 = dataclasses.replace(get_profile("h100"), launch_s=0.0, hbm_bytes_per_s=1e30)  # compute-bound only
    on, off = Cost.for_trace(tr, h100).durations, Cost.for_trace(tr, h100, allow_tf32=False).durations
    for i in mm:  # each FP32 matmul at the TF32 peak, 494.7 / 67 TF faster than in FP32
        assert off[i] / on[i] == pytest.approx(494.7 / 67)


def test_autocast_in_force_is_recorded():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tr = trace_workload("transformer-encoder", 2, fake=True, seq_len=16, num_layers=1)
    assert tr.meta["math"]["autocast_dtype"] == "bfloat16"
    assert any(tr.storages[op.writes[0]].dtype == "bfloat16" for op in tr.ops if op.name == "aten.mm.default")

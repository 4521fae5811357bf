"""`memplan calibrate`: the no-GPU error, the profile it writes, and (on a GPU) sane measurements."""

import json

import pytest
import torch

from memplan.cli import main
from memplan.cost import calibrate as cal
from memplan.cost.model import Cost
from memplan.cost.profiles import get_profile, profile_to_json
from memplan.testing.synthetic import chain_trace

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

FAKE = cal.Measurements(h2d_bytes_per_s=25e9, d2h_bytes_per_s=20e9, copy_latency_s=8e-6, launch_s=3e-6,
                        fp32_flops=50e12, tf32_flops=350e12, bf16_flops=700e12, hbm_bytes_per_s=2.8e12)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_calibrate_without_cuda_exits_2(capsys, tmp_path):
    code = main(["calibrate", "-o", str(tmp_path / "p.json")])
    _, err = capsys.readouterr()
    assert code == 2 and err.strip() == "memplan: error: calibrate needs a CUDA GPU"
    assert not (tmp_path / "p.json").exists()


def test_measured_profile_is_accepted_as_device(tmp_path):
    profile = cal.profile_from(FAKE, name="testgpu", description="Test GPU", memory_bytes=8 * 2**30)
    path = tmp_path / "testgpu.json"
    path.write_text(json.dumps(profile_to_json(profile)))
    loaded = get_profile(str(path))
    assert loaded == profile and loaded.calibrated
    # With efficiencies 1.0 the cost model uses the measured rates as they are.
    cost = Cost.for_trace(chain_trace(2), str(path))
    assert cost.h2d_s(25e9) == pytest.approx(1.0 + 8e-6)
    assert cost.d2h_s(20e9) == pytest.approx(1.0 + 8e-6)
    flops = chain_trace(2).ops[0].flops
    assert cost.durations[0] >= flops / 50e12


def test_slug():
    assert cal.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert cal.slug("!!") == "gpu"


@pytest.mark.gpu
@needs_gpu
def test_calibrate_on_gpu(tmp_path, capsys):
    code = main(["calibrate", "-o", str(tmp_path / "p.json"), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    data = json.loads(out)
    profile = get_profile(str(tmp_path / "p.json"))
    assert profile.calibrated and data["name"] == profile.name
    # Physical sanity: a PCIe link moves 1-100 GB/s, HBM 100 GB/s-10 TB/s, launches take 1-100 us,
    # tensor-core BF16 beats plain FP32, and nothing is absurd.
    assert 1e9 < profile.h2d_bytes_per_s < 1e11 and 1e9 < profile.d2h_bytes_per_s < 1e11
    assert 1e11 < profile.hbm_bytes_per_s < 1e13
    assert 1e-7 < profile.launch_s < 1e-4
    assert 1e12 < profile.fp32_flops < profile.bf16_flops < 5e15

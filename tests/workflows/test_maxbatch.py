"""max_batch's GPU probe, its bookkeeping run on the CPU (the GPU calls stood in)."""

from __future__ import annotations

from types import SimpleNamespace

from memplan.workflows import maxbatch


def test_the_gpu_probe_reports_what_a_run_measured(monkeypatch):
    # Its record read a key no run reports, so every batch that fitted on a GPU raised instead.
    cuda = maxbatch.torch.cuda
    monkeypatch.setattr(cuda, "get_device_properties", lambda dev: SimpleNamespace(total_memory=1 << 34))
    monkeypatch.setattr(cuda, "set_per_process_memory_fraction", lambda fraction, dev: None)
    fits = maxbatch._gpu_probe("resnet18-cifar", 1 << 33, "sqrt-n", "cpu", "h100", {})
    fitted, record = fits(2)
    assert fitted and set(record) == {"peak_reserved_bytes", "step_time_s"}
    assert record["step_time_s"] > 0

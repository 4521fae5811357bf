"""Op times from the device: a fake trace timed op by op, beside a measured plain training step.

Per model, on one device (a CUDA GPU, or this CPU):
- measured (op benchmark): a fake trace with `time_ops` (every distinct op call timed alone on
  real random inputs of its shapes, `memplan.tracing.opbench`): the sum of its op times, how
  many distinct calls were timed and how long the timing took;
- measured (as it runs): a real trace's op times (CUDA events per op on a GPU; on the CPU the
  least of 3 timed iterations per op) and their sum; `--no-real-trace` skips it;
- simulated (roofline): the fake trace without its op times, priced on the profile with the
  math settings it recorded (TF32 for cuDNN convolutions by default) and all in FP32 (what
  the cost model did before it read them);
- measured (plain step): plain PyTorch training without memplan, the median of `--steps`
  steps after 3 warm-up steps (CUDA synchronised around each).
Each figure is also given as a ratio to the measured plain step.

    python benchmarks/op_times.py --device cuda [--profile FILE] [--out DIR]   # on a GPU, <= 60 s on an H100
    .venv/bin/python benchmarks/op_times.py --device cpu                       # this CPU, small models

Writes op_times_<card>.{json,md} into --out (default benchmarks/results), <card> the slugged GPU
name (e.g. nvidia-h100-80gb-hbm3) or "cpu". Without --profile the device is calibrated first
(`memplan calibrate`, or `calibrate --device cpu`). On the CPU torch runs one thread (the host is shared).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from memplan import Problem, get_profile, get_workload, trace_workload
from memplan.services import time_steps
from memplan.cost.calibrate import slug
from memplan.cost.calibrate_cpu import cpu_model
from memplan.cost.profiles import DeviceProfile
from memplan.fileio import atomic_write_text

RESULTS = Path(__file__).parent / "results"
GPU_MODELS = ("resnet50@64", "hf:gpt2@8", "transformer-encoder@32")
CPU_MODELS = ("resnet18-cifar@8", "hf:gpt2@2", "transformer-encoder@8")
CONFIGS = {"cpu": {"hf:gpt2": {"n_layer": 2}}, "cuda": {}}
WARMUP_STEPS = 3
STEPS = 10
CPU_TIME_REPEATS = 3  # real CPU trace: timed iterations per op (optimes)
SEED = 0


def model_row(spec: str, device: str, profile: DeviceProfile, steps: int, real_trace: bool) -> dict:
    """Every figure of one model (see the module doc)."""
    name, batch = spec.rsplit("@", 1)
    batch, config = int(batch), CONFIGS["cpu" if device == "cpu" else "cuda"].get(name, {})
    row = {"model": name, "batch": batch, "config": config}
    started = time.perf_counter()
    fake = trace_workload(name, batch, fake=True, time_ops=True, **_device(device), **config)
    row.update(fake_trace_s=time.perf_counter() - started, ops=len(fake.ops), **_bench_figures(fake))
    untimed = _untimed(fake)
    row["roofline_s"] = Problem.of(untimed, profile=profile).cost.baseline_compute_s
    row["roofline_fp32_s"] = Problem.of(_fp32(untimed), profile=profile).cost.baseline_compute_s
    row["math"] = fake.meta["math"]
    if real_trace:
        started = time.perf_counter()
        real = trace_workload(name, batch, fake=False, time_repeats=CPU_TIME_REPEATS if device == "cpu" else 0,
                              **_device(device), **config)
        row["real_trace_s"] = time.perf_counter() - started
        row["real_trace_sum_s"] = sum(op.duration_s or 0.0 for op in real.ops)
        del real
        _release(device)
    row["measured_step_s"] = plain_step_s(name, batch, device, config, steps)
    for key in ("op_bench_sum_s", "real_trace_sum_s", "roofline_s", "roofline_fp32_s"):
        if row.get(key) is not None:
            row[key.removesuffix("_s") + "_ratio"] = row[key] / row["measured_step_s"]
    _release(device)
    return row


def _bench_figures(fake) -> dict:
    summary = fake.meta["op_times"]
    return {"op_bench_sum_s": sum(op.duration_s or 0.0 for op in fake.ops),
            "untimed_ops": sum(op.duration_s is None for op in fake.ops),
            "distinct_calls": summary["distinct_calls"], "op_bench_timing_s": summary["seconds"],
            "failed": summary["failed"]}


def _untimed(trace):
    """The trace without op times: what the roofline prices."""
    return replace(trace, ops=tuple(replace(op, duration_s=None) for op in trace.ops))


def _fp32(trace):
    """The trace with math settings that forbid TF32: the cost model prices every FP32 op at the FP32 rate."""
    math = {**(trace.meta.get("math") or {}), "cudnn_tf32": False, "matmul_tf32": False}
    return replace(trace, meta={**trace.meta, "math": math})


def plain_step_s(name: str, batch: int, device: str, config: dict, steps: int) -> float:
    """Median seconds of plain training steps (no memplan), after warm-up steps."""
    w = get_workload(name, batch, device=device, seed=SEED, **config)
    make_inputs = lambda i, w=w: w.make_inputs(batch, seed=SEED + 1 + i)  # noqa: E731
    time_steps(w.step, make_inputs, range(WARMUP_STEPS), w.model, SEED)
    times = time_steps(w.step, make_inputs, range(WARMUP_STEPS, WARMUP_STEPS + steps), w.model, SEED)
    del w, make_inputs  # the workload freed before the next model
    return statistics.median(times["wall"])


def _device(device: str) -> dict:
    return {} if device == "cpu" else {"device": device}


def _release(device: str) -> None:
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()


def device_profile(device: str, given: str | None) -> DeviceProfile:
    """The profile the roofline prices with: `given`, else this device calibrated now."""
    if given:
        return get_profile(given)
    if device == "cpu":
        from memplan.services import calibrate_cpu

        return calibrate_cpu()
    from memplan import calibrate

    return calibrate(torch.device(device).index or 0)


def card(device: str) -> str:
    """The name results are filed under: "cpu", or the slugged GPU name."""
    return "cpu" if device == "cpu" else slug(torch.cuda.get_device_name(torch.device(device)))


def markdown(data: dict) -> str:
    """The results as a Markdown page."""
    hw = data["hardware"]
    lines = ["# Op times from the device", "",
             f"Produced by `{data['command']}` on {hw} (torch {data['torch']}, {data['threads']} torch threads), "
             f"in {data['total_s']:.0f} s, load average {data['load_average'][0]} before and "
             f"{data['load_average'][1]} after ({os.cpu_count()} CPUs: on a shared host every time here is noisy). "
             "Step times in seconds; x = ratio to the measured plain step.", "",
             f"- measured, op benchmark: the sum of a fake trace's op times, each distinct call timed alone on "
             f"{hw} (`trace --fake --time-ops`);",
             f"- measured, as it runs: the sum of a real trace's op times on {hw};",
             f"- simulated: the roofline on profile `{data['profile']}` with the trace's math settings, and in FP32;",
             f"- measured, plain step: plain PyTorch training on {hw}, median of {data['steps']} steps.", "",
             "| model | ops | distinct calls | timing s | op benchmark (x) | real trace (x) | roofline (x) | "
             "roofline FP32 (x) | plain step |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']}@{r['batch']} | {r['error']} | | | | | | | |")
            continue
        lines.append(f"| {r['model']}@{r['batch']} | {r['ops']} | {r['distinct_calls']} | {r['op_bench_timing_s']:.1f} "
                     f"| {_with_ratio(r, 'op_bench_sum')} | {_with_ratio(r, 'real_trace_sum')} | "
                     f"{_with_ratio(r, 'roofline')} | {_with_ratio(r, 'roofline_fp32')} | {r['measured_step_s']:.4f} |")
    failed = {m: r["failed"] for r in data["rows"] if r.get("failed") for m in [r["model"]]}
    lines += ["", f"Ops that could not be timed alone (priced by the roofline instead): {failed or 'none'}."]
    return "\n".join(lines) + "\n"


def _with_ratio(row: dict, key: str) -> str:
    if row.get(f"{key}_s") is None:
        return "-"
    return f"{row[f'{key}_s']:.4f} ({row[f'{key}_ratio']:.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    p.add_argument("--models", default=None, help="comma-separated NAME@BATCH (default: per device)")
    p.add_argument("--profile", default=None, help="profile of the roofline (default: calibrate the device now)")
    p.add_argument("--steps", type=int, default=STEPS, help="timed plain steps per model")
    p.add_argument("--no-real-trace", dest="real_trace", action="store_false", help="skip the real traces")
    p.add_argument("--out", default=str(RESULTS), help="folder of op_times_<card>.{json,md}")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("op_times: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    profile = device_profile(args.device, args.profile)
    models = args.models.split(",") if args.models else (CPU_MODELS if args.device == "cpu" else GPU_MODELS)
    rows = []
    for spec in models:
        try:
            rows.append(model_row(spec, args.device, profile, args.steps, args.real_trace))
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, the others still run
            traceback.print_exc()
            rows.append({"model": spec.rsplit("@", 1)[0], "batch": int(spec.rsplit("@", 1)[1]),
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]})
            _release(args.device)
        print(json.dumps({k: v for k, v in rows[-1].items() if not isinstance(v, dict)}), flush=True)
    name = card(args.device)
    data = {"command": " ".join(["python", "benchmarks/op_times.py", *(argv if argv is not None else sys.argv[1:])]),
            "device": args.device, "card": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "hardware": (torch.cuda.get_device_name(torch.device(args.device)) if args.device != "cpu"
                         else f"{cpu_model()} CPU"),
            "profile": profile.name, "steps": args.steps, "rows": rows, "total_s": time.perf_counter() - started,
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"op_times_{name}.json", json.dumps(data, indent=1) + "\n")
    atomic_write_text(out / f"op_times_{name}.md", markdown(data))
    print(f"wrote {out / f'op_times_{name}.md'} in {data['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

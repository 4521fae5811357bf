"""Distributed planning figures: fake-PG tracing at scale, predicted vs measured per-rank peak,
and the collective cost model against DeepBench's measured all-reduce times.

    .venv/bin/python benchmarks/distributed_sim.py [--only trace7b,peak,allreduce]

Writes benchmarks/results/distributed_sim.{json,md}:
  trace7b    `hf:llama-7b` (batch 1, sequence 128) traced as rank 0 of a 64-rank FSDP2 job with
             fake tensors and the fake process group, in a subprocess: wall seconds and peak RSS
             (measured, CPU), and the trace's per-rank peak (a fake trace's load).
  peak       FSDP2 and DDP with 2 ranks on gloo (CPU, two real processes): the per-rank peak the
             fake-PG trace predicts (simulated, no plan) against the peak the memory meter measures
             in the real run (measured, CPU), for an MLP.
  allreduce  the ring all-reduce model against the all-reduce times DeepBench publishes in its
             README (TitanX GPUs, 8 per node over PCIe 3, InfiniBand FDR between nodes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
FLOAT = 4
# DeepBench README, "All-Reduce Results" (training): (floats, ranks, measured ms).
DEEPBENCH_ALLREDUCE = [(16777216, 8, 13.42), (16777216, 16, 46.53), (16777216, 32, 49.54),
                       (64500000, 8, 51.29), (64500000, 16, 87.47), (64500000, 32, 97.34)]
DEEPBENCH_GPUS_PER_NODE = 8
MLP_WIDTH, MLP_BATCH = 256, 32
# nccl-tests all_reduce_perf bus bandwidth at large sizes on 8 GPUs of one node, as a reference table
# publishes it ("NCCL-tests in practice", Alaya NeW tech blog, 2026-05-06,
# https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests): (profile, low, high) GB/s.
NCCL_BUSBW = [("h100", 460, 480), ("a100", 230, 250)]
BUSBW_BYTES = 8 * 2**30  # nccl-tests' largest size in that sweep (-e 8G)


def trace7b() -> dict:
    """Trace the 7B model in a fresh process; its wall time and peak RSS."""
    code = ("import json, resource, time; t=time.perf_counter();"
            "from memplan.services import trace_rank;"
            "tr = trace_rank('hf:llama-7b', 1, 'fsdp', 64);"
            "print(json.dumps({'seconds': time.perf_counter()-t, 'ops': len(tr.ops),"
            "'peak_load_bytes': int(tr.peak_load_bytes), 'collectives': len(tr.meta['collectives']),"
            "'rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mlp(batch, seed=0):
    """A 4-block MLP (Linear+ReLU blocks and a head), SGD with momentum."""
    import torch
    from torch import nn

    from memplan.zoo.workload import Workload

    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU()) for _ in range(4)]
    model = nn.Sequential(*blocks, nn.Linear(MLP_WIDTH, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs = (torch.randn(batch, MLP_WIDTH), torch.randint(0, 10, (batch,)))
    return Workload(name="mlp", model=model, optimizer=optimizer, inputs=inputs, batch=batch, input_size=None,
                    device=torch.device("cpu"), seed=seed, config={},
                    loss_fn=lambda m, x, y: nn.functional.cross_entropy(m(x), y))


def _rank(rank: int, store: str, engine: str, queue) -> None:
    import torch.distributed as dist

    import memplan
    from memplan.workflows.distributed import wrap_workload

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    workload = wrap_workload(mlp(MLP_BATCH), engine, fake=False)
    step = memplan.optimize(workload.step, *workload.inputs, planner="none", model=workload.model,
                            optimizer=workload.optimizer)
    for _ in range(3):
        step(*workload.inputs)
    if rank == 0:
        queue.put(step.stats()["measured_peak_bytes"])
    dist.destroy_process_group()


def measured_peak(engine: str) -> int:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, f"{tmp}/store", engine, queue)) for r in range(2)]
        for p in procs:
            p.start()
        peak = queue.get(timeout=300)
        for p in procs:
            p.join(60)
    return int(peak)


def peak() -> list[dict]:
    from memplan import DEFAULT_PROFILE, simulate
    from memplan.services import trace_rank

    rows = []
    for engine in ("fsdp", "ddp"):
        trace = trace_rank("distributed_sim:mlp", MLP_BATCH, engine, 2)
        predicted = simulate(trace, profile=DEFAULT_PROFILE).peak_load_bytes
        measured = measured_peak(engine)
        rows.append({"engine": engine, "predicted_peak_bytes": int(predicted), "measured_peak_bytes": measured,
                     "error": predicted / measured - 1})
    return rows


def allreduce() -> list[dict]:
    from memplan.cost.network import collective_s, job_link

    rows = []
    for floats, ranks, ms in DEEPBENCH_ALLREDUCE:
        link = job_link(ranks, DEEPBENCH_GPUS_PER_NODE, "pcie3", "ib-fdr")
        predicted = collective_s("all_reduce", floats * FLOAT, ranks, link, "ring") * 1e3
        rows.append({"floats": floats, "ranks": ranks, "link": link.name, "measured_ms": ms,
                     "predicted_ms": predicted, "error": predicted / ms - 1})
    return rows


def busbw() -> list[dict]:
    from memplan import get_profile
    from memplan.cost.network import bus_bandwidth, collective_s, get_link

    rows = []
    for name, low, high in NCCL_BUSBW:
        link = get_link(get_profile(name).intra_link)
        seconds = collective_s("all_reduce", BUSBW_BYTES, 8, link)
        predicted = bus_bandwidth("all_reduce", BUSBW_BYTES, 8, seconds) / 1e9
        rows.append({"profile": name, "link": link.name, "published_low_gbps": low, "published_high_gbps": high,
                     "predicted_gbps": predicted, "error_low": predicted / high - 1, "error_high": predicted / low - 1})
    return rows


def markdown(results: dict, command: str) -> str:
    lines = ["# Distributed planning: tracing at scale, per-rank peak, all-reduce model", "",
             f"Produced by `{command}` on this 2-core CPU host (sections from earlier runs keep their "
             "command in distributed_sim.json).", ""]
    if "trace7b" in results:
        r = results["trace7b"]
        lines += ["## hf:llama-7b, FSDP2, world size 64, fake tensors (batch 1, sequence 128)", "",
                  "| wall seconds (measured, CPU) | peak RSS (measured, CPU) | ops | collectives | per-rank peak load (fake trace) |",
                  "| --- | --- | --- | --- | --- |",
                  f"| {r['seconds']:.1f} | {r['rss_bytes'] / 2**30:.2f} GiB | {r['ops']} | {r['collectives']} | "
                  f"{r['peak_load_bytes'] / 2**30:.2f} GiB |", ""]
    if "peak" in results:
        lines += ["## Per-rank peak, 2 ranks on gloo (MLP 4x256, batch 32 per rank)", "",
                  "| engine | predicted (simulated from the fake-PG trace) | measured (CPU, memory meter) | error |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {r['engine']} | {r['predicted_peak_bytes']} B | {r['measured_peak_bytes']} B | "
                  f"{r['error']:+.1%} |" for r in results["peak"]]
        lines.append("")
    if "allreduce" in results:
        lines += ["## Ring all-reduce model against DeepBench's measured all-reduce (README, training results)", "",
                  "DeepBench: TitanX GPUs, 8 per node on PCIe 3 (pairs share a x16 switch), InfiniBand FDR "
                  "between nodes; times measured by DeepBench, predictions simulated (memplan.cost.network, "
                  "pcie3 / ib-fdr links).", "",
                  "| floats | ranks | link | measured ms (DeepBench) | predicted ms (simulated) | error |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['floats']} | {r['ranks']} | {r['link']} | {r['measured_ms']:.2f} | "
                  f"{r['predicted_ms']:.2f} | {r['error']:+.0%} |" for r in results["allreduce"]]
        lines.append("")
    if "busbw" in results:
        lines += ["## Ring all-reduce bus bandwidth against published nccl-tests figures (8 GPUs, one node)", "",
                  "Published: nccl-tests `all_reduce_perf` busbw at large sizes, from the table in "
                  "\"NCCL-tests in practice\" (Alaya NeW tech blog, 2026-05-06; a secondary source, "
                  "measured by its authors); predicted: memplan.cost.network at 8 GiB (simulated).", "",
                  "| profile | link | published busbw GB/s | predicted busbw GB/s (simulated) | error |",
                  "| --- | --- | --- | --- | --- |"]
        # rows written before issue 38 name the profile "device" (a partial run keeps other sections' rows)
        lines += [f"| {r.get('profile', r.get('device'))} | {r['link']} | {r['published_low_gbps']}-{r['published_high_gbps']} | "
                  f"{r['predicted_gbps']:.0f} | {r['error_low']:+.0%} to {r['error_high']:+.0%} |"
                  for r in results["busbw"]]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="trace7b,peak,allreduce,busbw")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    wanted = args.only.split(",")
    jobs = {"trace7b": trace7b, "peak": peak, "allreduce": allreduce, "busbw": busbw}
    path = RESULTS / "distributed_sim.json"
    # A partial run (--only) updates its sections and keeps the others, each with its command.
    results = json.loads(path.read_text()) if path.exists() else {}
    commands = results.pop("commands", {})
    command = "python benchmarks/distributed_sim.py" + (f" --only {args.only}" if args.only != parser.get_default("only") else "")
    for name in jobs:
        if name in wanted:
            results[name] = jobs[name]()
            commands[name] = command
    results.pop("command", None)
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps({"commands": commands, **results}, indent=2) + "\n")
    (RESULTS / "distributed_sim.md").write_text(markdown(results, command))
    print(markdown(results, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What memplan's own executor costs the host, measured by running it (`memplan calibrate`).

`memplan.cost.calibrate_host` measures what any executor pays (a step's host work per op, a saved-tensor
hook, a dispatch mode); the executor's own work per action and per module call it runs again is
measured here, with the executor itself: a chain of tiny layers (so the copies move next to nothing)
trains plainly, with every saved activation swapped, and with every layer recomputed by running its
call again. Each figure is what the planned steps took beyond the plain one, less what the profile
already prices (hooks; the layers run again), per action or per run; the median of a few rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from ..cost.calibrate_host import host_clock
from ..cost.profiles import DeviceProfile
from .optimize import optimize

BLOCKS, WIDTH, BATCH = 12, 16, 4  # blocks of Linear-Tanh-Linear-Tanh: what a block saves inside is recomputed
STEPS, ROUNDS = 5, 3


def with_executor_costs(profile: DeviceProfile, device: str = "cpu") -> DeviceProfile:
    """`profile` with `action_s` and `region_s` measured on `device` (hook_s measured already)."""
    model, step, inputs = _chain(device)
    plain = _step_s(lambda: step(*inputs), device)
    swap, swaps = _planned_s(model, step, inputs, "save-on-cpu", profile, device)
    recompute, runs = _planned_s(model, step, inputs, "sqrt-n", profile, device, segments=BLOCKS)
    per_op = plain / max(1, runs["ops"])
    action = max(0.0, swap - plain - swaps["hooks"] * profile.hook_s) / max(1, swaps["actions"])
    region = max(0.0, recompute - plain - runs["hooks"] * profile.hook_s - runs["actions"] * action
                 - runs["rerun_ops"] * per_op) / max(1, runs["regions"])
    return replace(profile, action_s=action, region_s=region)


def _chain(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                                                      torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                  for _ in range(BLOCKS)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return model, step, (x, y)


def _planned_s(model, step, inputs, planner: str, profile: DeviceProfile, device: str, **params):
    """The step's time under `planner`'s plan (no budget), and what its executor did per step."""
    run = optimize(step, *inputs, planner=planner, model=model, measure=False, fake=False, profile=profile, **params)
    try:
        seconds = _step_s(lambda: run(*inputs), device)
        program, stats = run.program, run.stats()
    finally:
        run.close()
    n = max(1, stats["steps"])
    trace = run.trace
    return seconds, {"actions": len(program.actions), "hooks": 2 * len(trace.saved),
                     "regions": stats["regions_recomputed"] / n,
                     "rerun_ops": sum(r.stop - trace.calls[r.call].first_op for r in set(program.regions.values())),
                     "ops": len(trace.ops)}


def _step_s(fn, device: str) -> float:
    """Median seconds (`host_clock`) of a step over ROUNDS rounds of STEPS steps (after one)."""
    clock = host_clock(device)
    fn()
    rounds = []
    for _ in range(ROUNDS):
        if device == "cuda":
            torch.cuda.synchronize()
        started = clock()
        for _ in range(STEPS):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        rounds.append((clock() - started) / STEPS)
    return statistics.median(rounds)


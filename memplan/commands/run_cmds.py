"""`memplan run`: train a zoo model under a plan and measure it; `memplan maxbatch`."""

from __future__ import annotations

import sys

from ..errors import MemplanError
from ..problem import DEFAULT_PROFILE
from ..run_options import AllocatorMode, Clock, Executor, GraphMode, RunOptions
from ..units import format_bytes, parse_bytes
from .base import command
from .models import fits_or_says_so, use_working_dir
from .options import add_json_flag, budget_option, nonnegative_int, positive_int, torch_device
from .output import emit_json, print_rows


@command("maxbatch")
def add_maxbatch(sub):
    """Register `memplan maxbatch`."""
    p = sub.add_parser("maxbatch", help="largest batch that fits a memory cap under a planner")
    p.add_argument("model", help="zoo model name, hf:<name>, tv:<name> or module:function")
    cap = p.add_mutually_exclusive_group(required=True)  # two names for one limit: giving both is a mistake
    cap.add_argument("--memory", type=parse_bytes, dest="memory", metavar="SIZE",
                     help="memory cap, e.g. 11GiB (on a GPU the allocator's limit while probing)")
    cap.add_argument("--memory-cap", type=parse_bytes, dest="memory", metavar="SIZE",
                     help="the same as --memory (the name `run` uses)")
    p.add_argument("--planner", default="none")
    p.add_argument("--device", type=torch_device, default="cpu",
                   help="cuda: measured under the cap; cpu: planned/simulated")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="the cost model's device profile the planner plans for")
    p.add_argument("--limit", type=positive_int, default=1 << 16, help="largest batch tried")
    add_json_flag(p)
    p.set_defaults(func=run_maxbatch)


def run_maxbatch(args) -> int:
    """Search the batch and print it."""
    from .. import max_batch  # torch takes a second to import: only this command pays for it

    use_working_dir()
    out = max_batch(args.model, args.memory, planner=args.planner, device=args.device,
                    profile=args.profile, limit=args.limit)
    if not out["max_batch"]:
        raise MemplanError(f"no batch of {out['model']} fits {format_bytes(out['memory_bytes'])} with planner "
                           f"{out['planner']}, not even 1: {_why_not(out['probes'][0])}")
    if args.json:
        emit_json(out)
        return 0
    largest = f"at least {out['max_batch']} (the --limit: raise it to search further)" if out["at_limit"] \
        else str(out["max_batch"])
    print(f"{out['model']} under {format_bytes(out['memory_bytes'])} with {out['planner']}: "
          f"max batch {largest} ({out['source']})")
    for probe in out["probes"]:
        print(f"  batch {probe['batch']:<6} {'fits' if probe['fits'] else 'does not fit'}")
    return 0


def _why_not(probe: dict) -> str:
    """Why batch 1 did not fit, in a few words (the planner's refusal, or the simulated peak)."""
    if "reason" in probe:
        return probe["reason"]
    if "predicted_peak_bytes" in probe:
        return f"its plan simulates a peak of {format_bytes(probe['predicted_peak_bytes'])}"
    return "its plan does not simulate within the cap"


@command("run")
def add_run(sub):
    """Register `memplan run`."""
    p = sub.add_parser("run", help="train K steps under a plan and measure time and memory")
    p.add_argument("model", help="zoo model name (e.g. resnet18-cifar, hf:gpt2) or module:function")
    p.add_argument("--batch", type=positive_int, required=True)
    p.add_argument("--planner", default=None, help="registered planner name (default none)")
    p.add_argument("--budget", type=budget_option, default=None, help="bytes, 8GiB or 60%% of the unplanned peak")
    p.add_argument("--steps", type=positive_int, default=3, help="metered steps (default 3)")
    p.add_argument("--timed-steps", type=nonnegative_int, default=0,
                   help="then this many steps without the meter, timed only: measured_step_s is their median "
                        "(default 0: the metered steps after the first, less the meter's bookkeeping)")
    p.add_argument("--device", type=torch_device, default="cpu", help="where to train (cpu, cuda)")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="cost-model profile the planner plans for and the simulator times with: a built-in name or "
                        "a profile JSON (e.g. from `calibrate --device cpu`; with such a CPU profile and --device cpu "
                        "every op is timed for real first, and simulated_step_s answers to measured_step_s)")
    p.add_argument("--clock", choices=Clock.names(), default=Clock.WALL.value,
                   help="what step (and CPU op) times measure: wall time, or the main thread's CPU time, which a "
                        "shared host's other work does not inflate (but which leaves out waiting for copies)")
    p.add_argument("--check", action="store_true",
                   help="also train without a plan and report max_param_diff; exit 1 when a step's measured "
                        "peak exceeds the budget by more than 2%%")
    p.add_argument("--baseline", default=None, help="torch-checkpoint | sac-compute | save-on-cpu | compile-budget | compile-budget:F (F in (0, 1])")
    p.add_argument("--executor", choices=Executor.names(), default=Executor.AUTO.value,
                   help="auto: at autograd's hooks where the plan can run there, else interpreted (a dispatch "
                        "mode at every op); interpreted: always the dispatch mode")
    p.add_argument("--cuda-graph", choices=GraphMode.names(), default=GraphMode.OFF.value,
                   help="capture the planned step as one CUDA graph after warm-up steps and replay it: auto "
                        "where the step can be captured and runs on cuda, else eager with a warning saying "
                        "why; on: that is an error; off (default, until a GPU run shows captures work): never")
    p.add_argument("--compile", action="store_true",
                   help="run the model's forward through torch.compile, the plan lowered onto its partitioner "
                        "(recompute only without CUDA; docs/compile.md)")
    p.add_argument("--compile-mode", default=None, metavar="MODE",
                   help="torch.compile's mode with --compile (default, reduce-overhead, max-autotune, ...)")
    p.add_argument("--allocator", choices=AllocatorMode.names(), default=AllocatorMode.AUTO.value,
                   help="CUDA allocator: PyTorch's caching one, with expandable segments, or pool: the plan's "
                        "SmartPool layout (X+smartpool planners); auto (default): pool for such a plan on cuda")
    p.add_argument("--config", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="model options, as for `trace` (e.g. n_layer=4 for hf:gpt2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-cap", type=parse_bytes, default=None, metavar="SIZE",
                   help="emulate a device with SIZE of memory (e.g. 4GiB): on a GPU the allocator may use no more, "
                        "on the CPU a step measuring more fails; without --budget a plan gets SIZE less 5%%")
    trace_mode = p.add_mutually_exclusive_group()
    trace_mode.add_argument("--fake", dest="fake", action="store_true", default=None,
                            help="plan from a trace of fake copies (the default on a GPU: nothing is allocated)")
    trace_mode.add_argument("--real", dest="fake", action="store_false",
                            help="plan from a real trace (the default on the CPU: op times can be measured)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the measurement and print it; with --check, exit 1 when the run exceeded its budget."""
    # torch takes a second to import: only the commands that train pay for it
    from .. import run_workload
    from ..services import BUDGET_TOLERANCE, RESERVED_TOLERANCE, check_baseline, parse_model_config

    if args.baseline:
        check_baseline(args.baseline)
        if args.planner is not None:
            raise MemplanError(f"--baseline {args.baseline} runs PyTorch's own tool instead of a plan; "
                               f"drop --planner {args.planner} (or drop --baseline)")
    config = parse_model_config(args.config)
    use_working_dir()
    _check_run_options(args)
    options = _run_options(args)
    with fits_or_says_so(f"{args.model} at batch {args.batch}", args.device):
        out = run_workload(args.model, args.batch, planner=args.planner or "none", budget=args.budget,
                           options=options, config=config)
    if args.json:
        emit_json(out)
    else:
        _print_run(out)
    if args.check and not out["within_budget"]:
        print(f"memplan: check failed: a step under the final plan measured more than the budget of "
              f"{out['budget_bytes']} bytes + {BUDGET_TOLERANCE:.0%} allocated (or + {RESERVED_TOLERANCE:.0%} "
              f"reserved on a GPU): peak {out['measured_peak_bytes']} allocated, "
              f"{out['measured_peak_reserved_bytes']} reserved", file=sys.stderr)
        return 1
    return 0


def _run_options(args) -> RunOptions:
    """The run's options, as the command line gives them (`--compile-mode`: torch.compile's mode)."""
    compile = {"mode": args.compile_mode} if args.compile_mode is not None else args.compile
    return RunOptions.of(profile=args.profile, seed=args.seed, device=args.device, steps=args.steps,
                         timed_steps=args.timed_steps, clock=args.clock, fake=args.fake, executor=args.executor,
                         allocator=args.allocator, memory_cap=args.memory_cap, cuda_graph=args.cuda_graph,
                         compile=compile, baseline=args.baseline, check=args.check)


def _check_run_options(args) -> None:
    """The names, checked before the model is built and traced (the budget, when it was parsed)."""
    from .. import get_profile
    from ..services import check_model_name, get_planner  # check_model_name: torch (see run)

    check_model_name(args.model)
    if args.cuda_graph == "on" and not args.device.startswith("cuda"):
        raise MemplanError(f"--cuda-graph on: the step runs on {args.device}: a CUDA graph needs --device cuda")
    if args.cuda_graph == "on" and args.baseline:
        raise MemplanError(f"--cuda-graph on captures a planned step; --baseline {args.baseline} runs no plan")
    if args.compile_mode is not None and not args.compile:
        raise MemplanError(f"--compile-mode {args.compile_mode} sets torch.compile's mode: give --compile too")
    if args.compile and (args.baseline or args.cuda_graph != "off" or args.executor != "auto"):
        raise MemplanError("--compile runs the plan through torch.compile: it goes with neither --baseline, "
                           "--cuda-graph (use --compile-mode reduce-overhead) nor --executor")
    if args.planner is not None:
        get_planner(args.planner)
    get_profile(args.profile)


def _print_run(out: dict) -> None:
    rows = [("model", f"{out['model']} batch {out['batch']}"), ("planner", out["planner"]),
            ("budget", _b(out["budget_bytes"])),
            ("step times", ", ".join(_ms(t) for t in out["step_time_s"])),
            ("measured step", f"{_ms(out['measured_step_s'])} ({_step_source(out)})"),
            ("simulated step", _simulated_step(out)),
            ("measured peak", ", ".join(_b(r["measured_peak_bytes"]) for r in out["steps"])),
            ("measured reserved", ", ".join(_b(r.get("measured_peak_reserved_bytes")) for r in out["steps"])),
            ("simulated peak", _b(out["simulated_peak_bytes"])),
            ("within budget", "yes" if out["within_budget"] else "NO"),
            ("kept by", _kept_by(out)),
            ("allocator", _allocator(out)),
            ("CUDA graph", _graph(out.get("cuda_graph")))]
    ex = out["executor"]
    if ex is not None and ex.get("executor") == "compiled":
        rows += _compiled_rows(ex)
    elif ex is not None:  # a PyTorch tool runs without memplan's executor
        rows += [("host slab", format_bytes(ex["slab_bytes"])),
                 ("swapped out", f"{ex['swapped_out']} ({format_bytes(ex['swapped_out_bytes'])})"),
                 ("recomputed", f"{ex['recomputed']} storages, {ex['replayed_ops']} ops replayed"),
                 ("diverged steps", ex["diverged_steps"])]
    if out["predicted"]:
        rows.append(("predicted (simulated)", _predicted(out["predicted"])))
    if "max_param_diff" in out:
        rows += [("max param diff", f"{out['max_param_diff']:.3g}"),
                 ("max buffer diff", f"{out['max_buffer_diff']:.3g}")]
    print_rows(rows)


def _compiled_rows(ex: dict) -> list[tuple[str, str]]:
    """What a compiled run says of its compilations (memplan.workflows.compiled)."""
    rows = []
    for k, c in enumerate(ex["compilations"], 1):
        lowered = c["decisions_lowered"]
        missed = sum(c["decisions_not_lowered"].values())
        first = c.get("first_call_s")
        rows.append((f"compilation {k}", f"{c['planner']}: {lowered} decisions lowered, {missed} not; saves "
                     f"{format_bytes(c['saved_bytes'])}" + (f"; first call {first:.1f} s" if first else "")))
    return rows


def _kept_by(out: dict) -> str:
    if not out.get("replanned"):
        return "the first plan"
    return f"planning again {out['replanned']}x with a margin of {format_bytes(out['margin_bytes'])}"


def _allocator(out: dict) -> str:
    pool = out.get("pool")
    if not pool:
        return out.get("allocator", "caching")
    last = pool["steps"][-1] if pool["steps"] else {}
    return (f"pool {format_bytes(pool['pool_bytes'])}, {pool['slots']} slots; last step: {last.get('served', 0)} "
            f"served, {last.get('fallbacks', 0)} fallbacks, reserved {_b(last.get('peak_reserved_bytes'))}")


def _graph(g: dict | None) -> str:
    if not g:
        return "-"
    if not g["captured"]:
        return f"not captured: {g['reason']}"
    replay = g["schedule"]["predicted_replay_s"]
    return (f"captured after {g['warmup_steps']} warm-up steps, {g['replays']} replays"
            + (f" (simulated replay {_ms(replay)})" if replay is not None else ""))


def _predicted(p: dict) -> str:
    if not p.get("feasible", True):
        return f"infeasible at op {p['infeasible_op']}"
    return (f"{_ms(p['time_s'])} (overhead {p['overhead']:+.1%}), peak {_b(p['peak_load_bytes'])}, "
            f"link {format_bytes(p['link_bytes'])}")


def _step_source(out: dict) -> str:
    n, metered = len(out["timed_step_s"]), len(out["step_time_s"])
    if n:
        what = f"median of {n} unmetered step{'s' * (n > 1)}"
    elif metered > 2:
        what = f"median of the {metered - 1} metered steps after the first"
    elif metered == 2:
        what = "the metered step after the first"
    else:
        what = "the only metered step, warm-up included; --steps 2 or --timed-steps 1 give a steady one"
    return what + (", main thread's CPU time" if out["clock"] == "cpu" else "")


def _simulated_step(out: dict) -> str:
    if out["simulated_step_s"] is None:
        return "-"
    return f"{_ms(out['simulated_step_s'])} ({out['profile']}, {out['op_times']} op times)"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _b(n) -> str:
    return "-" if n is None else format_bytes(n)

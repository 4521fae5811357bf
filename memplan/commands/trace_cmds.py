"""`memplan trace` (record one iteration of a model) and `memplan info` (describe a trace)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import MemplanError
from ..units import format_bytes
from .base import command
from .models import fits_or_says_so, use_working_dir
from .options import add_json_flag, nonnegative_int, output_of, positive_int, torch_device
from .output import emit_json, print_rows

# Meta entries too long for a summary (per saved tensor lists); they stay in the file.
_LONG_META = ("pack_order", "pack_ops", "hook_events", "owners")
LONG_META_CHARS = 100  # a meta entry longer than this is cut short in the table
PHASE_COLOURS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}
GIB = 2**30
CPU_TIME_REPEATS = 3  # timed iterations of `trace --real` on the CPU
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


@command("trace")
def add_trace(sub) -> None:
    """Register `memplan trace`."""
    p = sub.add_parser("trace", help="record one training iteration of a model as a trace")
    p.add_argument("model", help="zoo model name (e.g. resnet50), hf:<name>, tv:<name>, or module:function")
    p.add_argument("--batch", type=positive_int, required=True, help="batch size")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fake", dest="fake", action="store_true", default=True,
                      help="fake tensors: nothing is allocated (default)")
    mode.add_argument("--real", dest="fake", action="store_false",
                      help="real tensors, with measured op times (CUDA events; on the CPU the least wall time "
                           "of --time-repeats more iterations)")
    p.add_argument("--input-size", type=positive_int, default=None,
                   help="image side in pixels (image models; default: the model's)")
    p.add_argument("--config", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="model options (int, float, true/false, else string)")
    p.add_argument("--device", type=torch_device, default="cpu",
                   help="where model and inputs live (e.g. cuda with --real)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untraced iterations first (default 1)")
    engine = p.add_mutually_exclusive_group()
    engine.add_argument("--ddp", dest="engine", action="store_const", const="ddp", default=None,
                        help="trace rank 0 of a DistributedDataParallel job (fake process group)")
    engine.add_argument("--fsdp", dest="engine", action="store_const", const="fsdp",
                        help="trace rank 0 of an FSDP2 (fully_shard) job (fake process group)")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks in the --ddp/--fsdp job (any number: nothing is allocated)")
    p.add_argument("--time-ops", action=argparse.BooleanOptionalAction, default=None,
                   help="fake traces: time each op alone on real random inputs of its shapes, on --device "
                        "(identical calls once); default: on for --device cuda, off on the CPU")
    p.add_argument("--time-repeats", type=nonnegative_int, default=CPU_TIME_REPEATS,
                   help=f"--real on the CPU: timed iterations after the traced one; each op gets its least "
                        f"(default {CPU_TIME_REPEATS}; 0: no op times)")
    p.add_argument("-o", "--output", type=output_of("JSON lines"), required=True,
                   help="trace file to write (JSON lines, .jsonl)")
    add_json_flag(p)
    p.set_defaults(func=run_trace)


@command("info")
def add_info(sub) -> None:
    """Register `memplan info`."""
    q = sub.add_parser("info", help="summarise a trace: ops, storages, peak load, bytes per kind")
    q.add_argument("trace", help="trace file")
    q.add_argument("--format", default=None, help="file format (detected when omitted)")
    q.add_argument("--per-op", action="store_true", help="also give the memory load at every op (a table; with "
                   "--json, the list load_per_op)")
    q.add_argument("--plot", type=output_of("plot"), default=None, metavar="FILE.png",
                   help="draw the load curve with phases shaded (.png, .pdf or .svg)")
    add_json_flag(q)
    q.set_defaults(func=run_info)


def run_trace(args) -> int:
    """Trace the model and write the trace file."""
    from .. import write_trace
    # torch takes a second to import: only the commands that build a model pay for it
    from .. import trace_workload
    from ..services import parse_model_config, trace_rank

    config = parse_model_config(args.config)
    use_working_dir()
    if not args.verbose:
        # A model that rejects its input fails inside a fake kernel; torch logs the traceback,
        # and we report the error in one line instead.
        logging.getLogger(_FAKE_TENSOR_LOGGER).setLevel(logging.CRITICAL)
    what = f"{args.model} at batch {args.batch}"
    _check_engine_options(args)
    time_ops = _time_ops(args)
    with _spinner(f"tracing {args.model}") as bar, fits_or_says_so(what, args.device):
        if args.engine:
            sizes = {} if args.input_size is None else {"input_size": args.input_size}
            trace = trace_rank(args.model, args.batch, args.engine, args.world_size, warmup=args.warmup,
                               progress=lambda n: bar.update(n - bar.n), **sizes, **config)
        else:
            trace = trace_workload(args.model, args.batch, fake=args.fake, input_size=args.input_size,
                                   warmup=args.warmup, progress=lambda n: bar.update(n - bar.n),
                                   time_repeats=0 if args.fake else args.time_repeats, time_ops=time_ops,
                                   **_device_option(args.device), **config)
    write_trace(trace, args.output)
    summary = {"output": str(args.output), **summarise(trace)}
    if args.json:
        emit_json(summary)
    else:
        _print_table(summary, trace)
    return 0


def _check_engine_options(args) -> None:
    from ..services import check_world_size  # torch (see run_trace)

    if args.engine is None:
        if args.world_size is not None:
            raise MemplanError("--world-size needs --ddp or --fsdp")
        return
    if args.world_size is None:
        raise MemplanError(f"--{args.engine} needs --world-size")
    check_world_size(args.world_size)
    if not args.fake or args.device != "cpu":
        raise MemplanError(f"--{args.engine} traces with fake tensors on the CPU (no --real, no --device)")


def _time_ops(args) -> bool:
    """Whether to time the ops of the fake trace: as asked, else on a GPU (a real trace times its own)."""

    if args.time_ops and (not args.fake or args.engine):
        raise MemplanError("--time-ops times the ops of a fake trace (not with --real, --ddp or --fsdp); "
                           "--real measures them as they run")
    if args.time_ops is None:
        return args.fake and not args.engine and args.device.startswith("cuda")
    return args.time_ops


def _device_option(device: str) -> dict:
    # The zoo's default is the CPU; pass the device only when another one is asked for.
    return {} if device == "cpu" else {"device": device}


def run_info(args) -> int:
    """Print the summary of a trace (and draw its load curve)."""
    from .. import load_any

    trace = load_any(args.trace, args.format)
    summary = summarise(trace)
    if args.per_op:
        summary["load_per_op"] = trace.load.tolist()
    if args.plot:
        plot_load(trace, args.plot)
        summary["plot"] = str(args.plot)
    if args.json:
        emit_json(summary)
    else:
        _print_table(summary, trace)
        if args.per_op:
            _print_per_op(trace)
    return 0


def _print_per_op(trace) -> None:
    """One line per op: index, phase, memory load while it runs, name and module."""
    width = len(str(max(trace.num_steps - 1, 0)))
    print()
    print(f"{'op':>{width}}  {'phase':<9}  {'load':>10}  name (module)")
    for op, load in zip(trace.ops, trace.load.tolist()):
        print(f"{op.index:>{width}}  {op.phase:<9}  {format_bytes(load):>10}  {op.name}"
              + (f" ({op.module})" if op.module else ""))


def summarise(trace) -> dict:
    """`Trace.summary()` without the per-saved-tensor lists in its meta."""
    summary = trace.summary()
    summary["meta"] = {k: v for k, v in summary["meta"].items() if k not in _LONG_META}
    return summary


def plot_load(trace, path) -> None:
    """Draw the memory load over op index, each phase shaded, to a PNG file."""
    from ..plots import new_figure, save_figure

    fig, ax = new_figure()
    steps = range(trace.num_steps)
    ax.step(steps, trace.load / GIB, where="post", color="black", lw=1)
    for phase, start, stop in _phase_runs(trace):
        ax.axvspan(start, stop, color=PHASE_COLOURS[phase], alpha=0.15, lw=0)
    for phase, colour in PHASE_COLOURS.items():
        ax.fill_between([], [], color=colour, alpha=0.3, label=phase)
    if trace.num_steps:
        ax.axhline(trace.peak_load_bytes / GIB, color="red", ls="--", lw=0.8,
                   label=f"peak {format_bytes(trace.peak_load_bytes)} at op {trace.peak_op}")
    ax.set_xlabel("op index")
    ax.set_ylabel("memory load (GiB)")
    ax.set_title(f"{trace.meta.get('model', 'trace')}: memory load over one iteration")
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path)


def _phase_runs(trace):
    """(phase, first op, one past last op) for each maximal run of one phase."""
    runs = []
    for op in trace.ops:
        if runs and runs[-1][0] == op.phase:
            runs[-1][2] = op.index + 1
        else:
            runs.append([op.phase, op.index, op.index + 1])
    return [tuple(r) for r in runs]


def _print_table(summary: dict, trace) -> None:
    rows = [("ops", summary["ops"]), ("storages", summary["storages"]),
            ("peak load", f"{format_bytes(summary['peak_load_bytes'])} ({summary['peak_load_bytes']} B)"),
            ("peak at op", f"{summary['peak_op']} {summary['peak_op_name'] or ''} ({summary['peak_phase'] or '-'})"),
            ("total FLOPs", f"{summary['total_flops']:.4g}")]
    rows += [(f"ops in {phase}", n) for phase, n in summary["ops_by_phase"].items()]
    rows += [(f"bytes {kind}", format_bytes(n)) for kind, n in summary["bytes_by_kind"].items()]
    rows += [(key, summary[key]) for key in ("output", "plot") if key in summary]
    rows += [(f"meta {k}", _meta_text(k, v, trace)) for k, v in summary["meta"].items() if v not in (None, {}, "")]
    print_rows(rows)


def _meta_text(key: str, value, trace) -> str:
    """A meta entry in one readable line: collectives counted per kind, anything long cut short."""
    from ..services import collective_totals

    if key == "collectives":
        return ", ".join(f"{kind} x{t['count']} ({format_bytes(t['bytes'])})"
                         for kind, t in collective_totals(trace).items())
    text = str(value)
    return text if len(text) <= LONG_META_CHARS else text[:LONG_META_CHARS - 1] + "… (all of it with --json)"


def _spinner(desc: str):
    """A tqdm counter of recorded ops on stderr (silent when stderr is not a terminal)."""
    from tqdm import tqdm  # here: tracing pays for its import, `memplan --help` does not

    return tqdm(desc=desc, unit=" ops", file=sys.stderr, disable=None, leave=False)

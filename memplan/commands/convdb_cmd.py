"""`memplan conv-db fill|show|import`: the convolution benchmark database (memplan.conv.db)."""

from __future__ import annotations

import time

from ..services import conv_policy_sizes
from ..errors import MemplanError
from ..units import format_bytes
from .base import command
from .options import add_json_flag
from .output import count, emit_json

DEEPBENCH_ALGO = "fastest"  # DeepBench reports the fastest cuDNN algorithm's time, not which one


@command("conv-db")
def add_conv_db(sub) -> None:
    """Register `conv-db` and its three actions."""
    p = sub.add_parser("conv-db", help="fill, show or import convolution benchmarks (SQLite; mu-cuDNN's cache)",
                       description="The convolution benchmark database the ucudnn planners read: one row per "
                                   "(kernel, micro-batch size, algorithm, source) with time and workspace.")
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))

    f = actions.add_parser("fill", help="benchmark every convolution kernel of a trace (or --kernel) at every "
                                        "micro-batch size of a policy; rows already there are kept")
    f.add_argument("db", help="database file (created when missing)")
    f.add_argument("trace", nargs="?", help="trace file whose convolutions to benchmark")
    f.add_argument("--kernel", action="append", default=[], metavar="SPEC",
                   help="a kernel as `memplan conv-db show` names it, e.g. 'fwd n64 c96x27x27 k256 5x5 p2 s1' "
                        "(repeatable)")
    f.add_argument("--source", default="model",
                   help="model (the fitted family model for --profile), cpu (PyTorch here, measured) or cudnn "
                        "(a CUDA GPU with nvidia-cudnn-frontend, measured)")
    f.add_argument("--profile", default="v100", help="the device profile of the model source (default v100)")
    f.add_argument("--policy", default="powerOfTwo", help="micro-batch sizes: all, powerOfTwo (default), undivided")
    add_json_flag(f)
    f.set_defaults(func=run_fill)

    s = actions.add_parser("show", help="rows per source, or the rows of one kernel")
    s.add_argument("db", help="database file")
    s.add_argument("--source", default=None, help="only this source (e.g. model:v100) or kind of source (cpu, "
                   "model, cudnn, deepbench)")
    s.add_argument("--kernel", default=None, metavar="SPEC", help="the rows of this kernel (at its batch)")
    add_json_flag(s)
    s.set_defaults(func=run_show)

    i = actions.add_parser("import", help="copy rows from another database, or DeepBench's conv CSV "
                                          "(source deepbench:<gpu>, workspace unknown)")
    i.add_argument("db", help="database file (created when missing)")
    i.add_argument("file", help="a memplan conv-db file or DeepBench's conv_train_fp32.csv")
    add_json_flag(i)
    i.set_defaults(func=run_import)


def _kernels(args) -> list:
    from .. import load_any
    from ..services import parse_conv_kernel, trace_conv_kernels

    kernels = [parse_conv_kernel(spec) for spec in args.kernel]
    if args.trace:
        found = trace_conv_kernels(load_any(args.trace))
        if not found:
            raise MemplanError(f"{args.trace}: the trace has no 2-D convolution")
        kernels += [tk.kernel for tk in found]
    if not kernels:
        raise MemplanError("conv-db fill: give a trace file or --kernel")
    return list(dict.fromkeys(kernels))


def run_fill(args) -> int:
    """Benchmark what is missing, print what was added."""
    from .. import get_profile
    from ..services import ConvDB, get_conv_source  # get_conv_source: torch (a second), only `fill` pays

    kernels = _kernels(args)
    wanted = list(dict.fromkeys(k.with_batch(b) for k in kernels for b in conv_policy_sizes(args.policy, k.n)))
    source = get_conv_source(args.source, get_profile(args.profile) if args.source == "model" else None)
    started = time.perf_counter()
    with ConvDB(args.db) as db:
        missing = [k for k in wanted if not db.get(k, source.name)]
        rows = source.measure(missing)
        db.put(rows)
    out = {"db": args.db, "source": source.name, "kernels": len(kernels), "micro_batch_kernels": len(wanted),
           "benchmarked": len(missing), "rows_added": len(rows), "seconds": round(time.perf_counter() - started, 3)}
    if args.json:
        emit_json(out)
    else:
        there = len(wanted) - len(missing)
        print(f"{args.db}: {count(len(rows), 'row')} from {source.name} for {count(len(missing), 'micro-batch size')} "
              f"of {count(len(kernels), 'kernel')} (policy {args.policy})"
              + (f"; {there} already there" if there else "") + f", in {out['seconds']:.2f} s")
    return 0


def run_show(args) -> int:
    """Per-source summary, or one kernel's rows."""
    from ..services import ConvDB, parse_conv_kernel

    with ConvDB(args.db, create=False) as db:
        if args.kernel is None:
            summary = [s for s in db.summary() if _matches(s["source"], args.source)]
            if args.json:
                emit_json({"db": args.db, "sources": summary})
                return 0
            if not summary:
                print(f"{args.db}: no rows" + (f" from {args.source}" if args.source else ""))
            for s in summary:
                print(f"{s['source']}: {count(s['rows'], 'row')}, {count(s['kernels'], 'kernel shape')}, "
                      f"{count(s['batches'], 'micro-batch size')}, workspace unknown in {s['workspace_unknown']}")
            return 0
        kernel = parse_conv_kernel(args.kernel)
        sources = [s["source"] for s in db.summary() if _matches(s["source"], args.source)]
        rows = [r for src in sources for r in db.get(kernel, src)]
    if not rows:
        raise MemplanError(f"{args.db}: no rows for kernel {kernel.describe()!r}"
                           + (f" from {args.source}" if args.source else "") + " (memplan conv-db fill adds them)")
    listed = [{"source": r.source, "algo": r.algo, "time_s": r.time_s, "workspace_bytes": r.workspace_bytes}
              for r in sorted(rows, key=lambda r: (r.source, r.time_s))]
    if args.json:
        emit_json({"db": args.db, "kernel": kernel.describe(), "rows": listed})
        return 0
    print(kernel.describe())
    for r in listed:
        ws = "unknown" if r["workspace_bytes"] is None else format_bytes(r["workspace_bytes"])
        print(f"  {r['source']:<28} {r['algo']:<24} {r['time_s'] * 1e3:10.4f} ms  workspace {ws}")
    return 0


def _matches(source: str, wanted: str | None) -> bool:
    """Whether `--source wanted` selects `source`: no filter, the same name, or its kind ("cpu" for
    "cpu:<processor>", "model" for "model:v100")."""
    return wanted is None or source == wanted or source.startswith(f"{wanted}:")


def run_import(args) -> int:
    """Merge another database or DeepBench's CSV into DB."""
    from ..services import ConvDB, ConvDBRow, read_conv_csv

    is_sqlite = _head(args.file).startswith(b"SQLite format 3\0")
    with ConvDB(args.db) as db:
        if is_sqlite:
            with ConvDB(args.file, create=False) as other:
                added = db.merge(other)
            what = "memplan conv-db"
        else:
            measured = read_conv_csv(args.file)
            rows = [ConvDBRow(kernel=k, algo=DEEPBENCH_ALGO, source=f"deepbench:{device}", time_s=t,
                              workspace_bytes=None)
                    for device, samples in measured.items() for k, t in samples]
            db.put(rows)
            added, what = len(rows), "DeepBench CSV"
    if args.json:
        emit_json({"db": args.db, "file": args.file, "format": what, "rows": added})
    else:
        print(f"{args.db}: {added} rows from {args.file} ({what})")
    return 0


def _head(path: str) -> bytes:
    """The first 16 bytes of a file, or one error line."""
    try:
        with open(path, "rb") as fh:
            return fh.read(16)
    except OSError as exc:
        raise MemplanError(f"{path}: cannot read: {exc.strerror or exc}") from None

"""The `memplan` command line: one sub-command per module in memplan/commands/.

Every command takes `--json` (then prints exactly one JSON object on stdout). A user
mistake prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import math
import os
import shutil
import sys
import textwrap

from .errors import MemplanError, is_allocation_failure

# Each module defines add_parser(subparsers) and sets `func(args) -> int` on its parser.
COMMAND_MODULES = (
    "memplan.commands.trace_cmds",     # trace, info
    "memplan.commands.simulate_cmd",   # simulate
    "memplan.commands.plan_cmds",      # plan, planners, calibrate
    "memplan.commands.pool_cmd",       # pool
    "memplan.commands.sweep_cmd",      # sweep
    "memplan.commands.compare_cmd",    # compare
    "memplan.commands.run_cmds",       # run, maxbatch
    "memplan.commands.fit_cmd",        # fit
    "memplan.commands.demo_cmd",       # demo
    "memplan.commands.convdb_cmd",     # conv-db fill|show|import
    "memplan.commands.dqn_cmd",        # dqn train
)

USAGE_ERROR = 2
TEXT_COLUMNS = 100  # width of text output when stdout is not a terminal
MIN_VALUE_COLUMNS = 40  # a table's value column is never narrower than this
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader went away (`memplan info t.jsonl | head`)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line and exits 2."""

    def error(self, message):
        raise MemplanError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every sub-command registered."""
    parser = _Parser(prog="memplan", description="Plan and run PyTorch training beyond GPU memory: "
                     "trace an iteration, plan swaps/recomputes/pool, simulate, train under the plan.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code.

    The one error boundary of every command: a MemplanError is one line on stderr and exit
    code 2 (with `--json`, also `{"error": line}` on stdout), an interrupt exit code 130, a
    closed stdout (a pipe into `head`) a quiet exit 141.
    """
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = None
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away is told apart here, not at interpreter exit
        return code
    except MemplanError as exc:
        # One line, whatever the message quotes (a library's multi-line error text).
        line = " ".join(str(exc).split())
        if getattr(args, "json", False) if args is not None else "--json" in argv:
            emit_json({"error": line})
        print(f"memplan: error: {line}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("memplan: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass  # not a file descriptor (a test's captured stdout): nothing will flush it at exit


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


# --- option types: a bad value is refused while parsing, in one line --------------------------


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer of at least 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def output_file(text: str) -> str:
    """argparse type: a file name that can be written (checked before any long work)."""
    return _checked_path(text, None)


def output_of(kind: str):
    """argparse type: a `kind` file (a key of `fileio.SUFFIXES`: "JSON", "plot", ...) that can
    be written, its name ending as that format's do."""

    def output(text: str) -> str:
        return _checked_path(text, kind)

    output.__name__ = f"{kind} file"
    return output


def output_folder(text: str) -> str:
    """argparse type: a folder that exists and is writable, or can be made (its parent exists)."""
    from .fileio import check_output_folder

    try:
        check_output_folder(text)
    except MemplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _checked_path(text: str, kind: str | None) -> str:
    from .fileio import check_output_path

    try:
        check_output_path(text, kind)
    except MemplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def torch_device(text: str) -> str:
    """argparse type: a torch device that exists on this host ("cpu", "cuda", "cuda:1")."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (examples: cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device on this host (use cpu)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: this host has {torch.cuda.device_count()} CUDA device(s)")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"device {text!r} is not supported (cpu or cuda)")
    return text


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


@contextlib.contextmanager
def fits_or_says_so(what: str, device: str):
    """Turn a failed allocation (host or GPU) into one line: `what` does not fit on `device`."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if not is_allocation_failure(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise MemplanError(f"{what} does not fit in {device} memory ({first or type(exc).__name__}); "
                           f"try a smaller --batch") from None


def use_working_dir() -> None:
    """Let `module:function` models import from the current folder, as `python -m` does."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add the `--json` flag every command has."""
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def print_rows(rows) -> None:
    """Print (name, value) rows as two columns, the first as wide as its longest name and a
    long value wrapped under its column to the terminal's width."""
    width = max((len(str(name)) for name, _ in rows), default=0)
    room = max(shutil.get_terminal_size((TEXT_COLUMNS, 0)).columns - width - 2, MIN_VALUE_COLUMNS)
    for name, value in rows:
        lines = textwrap.wrap(str(value), room, break_long_words=False, break_on_hyphens=False) or [""]
        print(f"{name:<{width}}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':<{width}}  {line}")


def print_table(header: tuple[str, ...], rows: list[tuple], left: int = 1) -> None:
    """Print a table whose columns are as wide as their widest cell: the first `left` columns
    aligned left (names), the others right (numbers)."""
    cells = [tuple(map(str, header))] + [tuple(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(header))]
    for row in cells:
        print("  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))).rstrip())


def readable(key: str, value) -> tuple[str, str]:
    """A JSON field as a table row: its name in words, its value in human units (`*_bytes` in
    KiB/MiB/GiB, `*_s` in seconds, overheads and gaps in percent, none as "-")."""
    from .units import format_bytes

    name = key.replace("_", " ")
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif key.endswith("_bytes") and isinstance(value, int):
        name, text = name.removesuffix(" bytes"), format_bytes(value)
    elif key.endswith("_s") and isinstance(value, (int, float)):
        name, text = name.removesuffix(" s"), f"{value:.3g} s"
    elif key.endswith(("overhead", "gap")) and isinstance(value, (int, float)):
        text = f"{value:.2%}"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return name, text


def count(n: int, noun: str) -> str:
    """`n` and the noun, plural unless n is 1: "1 kernel", "3 kernels"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def emit_json(obj: dict) -> None:
    """Print one JSON object on stdout (numpy scalars and other odd types as plain values)."""
    print(json.dumps(obj, default=_plain))


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

"""The `memplan` command line: one sub-command per module in memplan/commands/.

Every command takes `--json` (then prints exactly one JSON object on stdout). A user
mistake prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

from .errors import MemplanError

# Each module defines add_parser(subparsers) and sets `func(args) -> int` on its parser.
COMMAND_MODULES = (
    "memplan.commands.trace_cmds",     # trace, info
    "memplan.commands.simulate_cmd",   # simulate
    "memplan.commands.plan_cmds",      # plan, planners, calibrate
    "memplan.commands.pool_cmd",       # pool
    "memplan.commands.sweep_cmd",      # sweep
    "memplan.commands.run_cmds",       # run, maxbatch
    "memplan.commands.demo_cmd",       # demo
)

USAGE_ERROR = 2


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
    """Run the CLI; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        return int(args.func(args) or 0)
    except MemplanError as exc:
        print(f"memplan: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("memplan: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add the `--json` flag every command has."""
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def emit_json(obj: dict) -> None:
    """Print one JSON object on stdout (numpy scalars and other odd types as plain values)."""
    print(json.dumps(obj, default=_plain))


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

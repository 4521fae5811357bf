"""The `memplan` command line: the sub-commands registered in memplan/commands/.

Every command takes `--json` (then prints exactly one JSON object on stdout). A user
mistake prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys

from .commands.base import COMMANDS
from .commands.output import emit_json
from .errors import MemplanError

USAGE_ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader went away (`memplan info t.jsonl | head`)


# Options renamed: an old spelling given to a command that no longer has it is told the new one.
RENAMED = {"--device": ("--profile", "the cost model's device profile; --device, where torch runs, is an option "
                                     "of the commands that trace or train")}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line and exits 2."""

    def error(self, message):
        raise MemplanError(f"{self.prog}: {message}{_renamed(message)}")


def _renamed(message: str) -> str:
    """What a renamed option is called now, for the old spellings among unrecognized arguments."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    given = {word.split("=")[0] for word in message.split(":", 1)[1].split()}
    return "".join(f"; {old} is {new} now ({why})" for old, (new, why) in RENAMED.items() if old in given)


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every sub-command registered."""
    parser = _Parser(prog="memplan", description="Plan and run PyTorch training beyond GPU memory: "
                     "trace an iteration, plan swaps/recomputes/pool, simulate, train under the plan.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in COMMANDS.entries().values():  # by name: `memplan --help` lists them alphabetically
        add(sub)
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

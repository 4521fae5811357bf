"""The command registry: each sub-command of `memplan` registers the function that adds it.

A command module decorates, for each sub-command it defines, a function that adds its parser
to the `memplan` parser and sets `func(args) -> int` on it; the registry finds every module of
this package (memplan.registry says why planners, allocators and commands all register this
way), so a new command is one new module. Helpers shared by commands live in `options`,
`output` and `models`, which command modules import (never memplan.cli, which imports them).

Every command module is imported to build the parser, so at the top a command module imports
only what its parser needs (the standard library, these helpers, `memplan.errors`, `units`,
`budget`, `fileio`); numpy, torch and the layers built on them are imported by the functions
that use them. `memplan --help`, and a mistake in a command's options, then cost no more than
the parser (`tests/project/test_cli_startup.py` keeps numpy and torch out of `memplan --help`).
"""

from __future__ import annotations

import argparse
from typing import Callable

from ..registry import Registry

AddCommand = Callable[[argparse._SubParsersAction], None]  # adds one sub-command's parser

COMMANDS: Registry[AddCommand] = Registry("command", "memplan.commands")


def command(name: str) -> Callable[[AddCommand], AddCommand]:
    """Decorator: register `add(sub)`, which adds sub-command `name` to the `memplan` parser."""

    def wrap(add: AddCommand) -> AddCommand:
        return COMMANDS.add(name, add)

    return wrap

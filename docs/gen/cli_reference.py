"""Append every command's usage and options to cli.md, read from the argparse parser itself.

Run by the mkdocs-gen-files plugin at build time, so the reference cannot drift from the CLI.
"""

from __future__ import annotations

import argparse
import html
import os

import mkdocs_gen_files

from memplan.cli import build_parser

PAGE = "cli.md"
os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal's width; fix it


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """(one-line help, parser) of each sub-command, in the order they were registered."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _help(action: argparse.Action, prog: str) -> str:
    """The option's help with argparse's %(default)s-style fields filled in, as `--help` shows it."""
    text = action.help or ""
    if "%" in text:
        text = text % dict(vars(action), prog=prog)
    takes_value = action.nargs != 0  # a flag's default is only the value of its destination
    if takes_value and action.default not in (None, [], argparse.SUPPRESS) and "default" not in text:
        text += f" (default: {action.default})"
    return text


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    """A table of the parser's arguments and options (none: no lines)."""
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = action.metavar or action.dest
        rows.append(f"| `{name}` | {_cell(_help(action, parser.prog))} |")
    if not rows:
        return []
    return ["| option | meaning |", "| --- | --- |", *rows, ""]


def _section(summary: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    """A heading with the command, its summary, its usage and its options; then its sub-commands."""
    lines = [f"{'#' * level} `{parser.prog}`", "", _cell(summary) if summary else "", "",
             "```text", parser.format_usage().strip(), "```", "", *_options_table(parser)]
    for sub_summary, sub in _subcommands(parser):
        lines += _section(sub_summary, sub, level + 1)
    return lines


def reference() -> str:
    """Markdown for every sub-command of `memplan`."""
    root = build_parser()
    lines = ["## Reference", "",
             "Generated from the command-line parser when the site is built "
             "(the same text as `memplan COMMAND --help`). Options every command takes, before it:", "",
             *_options_table(root)]
    for summary, parser in _subcommands(root):
        lines += _section(summary, parser, 3)
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open(PAGE, "a") as page:
    page.write("\n" + reference())

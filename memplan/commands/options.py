"""The option types every command shares: a bad value is refused while parsing, in one line.

Each is an argparse `type`; the parser turns its `ArgumentTypeError` into a one-line error
and exit code 2 (memplan.cli).
"""

from __future__ import annotations

import argparse
import math

from ..budget import Budget, parse_budget, parse_budgets
from ..errors import MemplanError
from ..fileio import check_output_folder, check_output_path


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
    try:
        check_output_folder(text)
    except MemplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _checked_path(text: str, kind: str | None) -> str:
    try:
        check_output_path(text, kind)
    except MemplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def torch_device(text: str) -> str:
    """argparse type: a torch device that exists on this host ("cpu", "cuda", "cuda:1")."""
    import torch  # torch takes a second to import: only a command given a device pays for it

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


def budget_option(text: str) -> Budget:
    """argparse type: a budget (memplan.budget): bytes, a share of the peak ("60%") or "none"."""
    try:
        return parse_budget(text)
    except MemplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def budgets_option(text: str) -> list[Budget]:
    """argparse type: a comma-separated list of budgets ("100%,80%,8GiB")."""
    try:
        return parse_budgets(text)
    except MemplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add the `--json` flag every command has."""
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

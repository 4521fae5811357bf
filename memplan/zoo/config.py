"""Model configuration: `key=value` parsing for the CLI and checking overrides against defaults."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..errors import MemplanError

_TRUE = ("true", "yes", "on")
_FALSE = ("false", "no", "off")


def parse_config(items: Iterable[str] | None) -> dict:
    """Parse CLI `key=value` strings into a dict, inferring int, float, bool or str values.

    Args:
        items: strings like ``"n_layer=2"``, ``"lr=1e-3"``, ``"batch_norm=false"``, ``"act=gelu"``.

    Returns:
        ``{key: value}``; a later duplicate key wins.

    Raises:
        MemplanError: an item without ``=`` or with an empty key.
    """
    config = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise MemplanError(f"model config: expected key=value, got {item!r}")
        config[key] = parse_value(text.strip())
    return config


def parse_value(text: str):
    """One config value: int, then float, then bool (true/false/yes/no/on/off), else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    return text


def merge_config(what: str, defaults: Mapping, overrides: Mapping) -> dict:
    """Defaults updated by overrides, each override checked for a known key and a fitting type.

    Args:
        what: the model name, for error messages.
        defaults: every accepted key with its default value (which fixes its type).
        overrides: the caller's values.

    Returns:
        A new dict with all keys of `defaults`.

    Raises:
        MemplanError: an unknown key, or a value of the wrong type.
    """
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise MemplanError(f"model {what}: unknown config key(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(defaults)) or 'none'}")
    merged = dict(defaults)
    for key, value in overrides.items():
        merged[key] = coerce(what, key, value, defaults[key])
    return merged


def coerce(what: str, key: str, value, default):
    """`value` converted to the type of `default` where that is lossless, else MemplanError.

    Numbers must be finite and not negative, and a count or size (an int whose default is at least 1)
    must be at least 1: `n_layer=-3` or `num_classes=0` is refused, not built.
    """
    _check_sign(what, key, value, default)
    if default is None or isinstance(value, type(default)) and not _bool_for_number(value, default):
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)
    if isinstance(default, (list, tuple)) and isinstance(value, str):
        return type(default)(parse_value(part) for part in value.split(","))
    raise MemplanError(f"model {what}: config {key}={value!r} should be a {type(default).__name__}")


def _check_sign(what: str, key: str, value, default) -> None:
    if _is_number(value) and not math.isfinite(value):  # lr=nan would train on NaNs without a word
        raise MemplanError(f"model {what}: config {key}={value!r} must be a finite number")
    if default is None or not _is_number(value) or not _is_number(default):
        return
    if value < 0 or (value < 1 and isinstance(default, int) and default >= 1):
        low = "at least 1" if isinstance(default, int) and default >= 1 else "0 or more"
        raise MemplanError(f"model {what}: config {key}={value!r} must be {low}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bool_for_number(value, default) -> bool:
    # bool is a subclass of int: `depth=true` must not pass as an int.
    return isinstance(value, bool) != isinstance(default, bool)

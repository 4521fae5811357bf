"""Names a package exports but imports only when first used (`import memplan` stays cheap, and
a command that never builds a model imports no torch through `memplan.zoo`)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: each name of `exports` (name -> the module
    that defines it, or "module:attribute" where the name differs there) is imported from its
    module on first use."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            module, _, attribute = exports[name].partition(":")
            return getattr(importlib.import_module(module), attribute or name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

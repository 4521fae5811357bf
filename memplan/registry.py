"""One way to register named things: planners, pool allocators and commands.

Each entry is declared next to its code with its registry's decorator, and a registry imports
every module of its own package the first time it is asked for its entries. Why this style for
all three: adding a planner, an allocator or a command is adding one module (no list elsewhere
to edit or forget), and a lookup always sees every entry, however the package was imported.
Modules whose names start with "_" are a package's helpers and are not imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

from .errors import unknown_name

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name, registered by the modules of one package.

    Args:
        kind: what an entry is, for the unknown-name error ("planner", "allocator", ...).
        package: the package whose modules register the entries.
    """

    def __init__(self, kind: str, package: str):
        self.kind = kind
        self.package = package
        self.by_name: dict[str, T] = {}  # every entry registered so far
        self._loaded = False

    def add(self, name: str, entry: T) -> T:
        """Register `entry` as `name` (a module's decorator calls this at import)."""
        self.by_name[name] = entry
        return entry

    def entries(self) -> dict[str, T]:
        """Every entry, sorted by name (the package's modules are imported on the first call)."""
        self._load()
        return dict(sorted(self.by_name.items()))

    def get(self, name: str) -> T:
        """The entry registered as `name`.

        Raises:
            UnknownNameError: no such entry; the message lists the known names.
        """
        entries = self.entries()
        if name not in entries:
            raise unknown_name(self.kind, name, entries)
        return entries[name]

    def _load(self) -> None:
        if self._loaded:
            return
        package = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")
        self._loaded = True

"""The base of memplan's closed vocabularies (action kinds, residency states, allocator modes).

A member is its name as a string: it compares equal to that string, and files, logs and
JSON see the string, so typing a vocabulary changes no file format.
"""

from __future__ import annotations

import enum


class Vocabulary(str, enum.Enum):
    """A closed set of names; each member is the string it is written as."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every member as written, in declaration order."""
        return tuple(m.value for m in cls)

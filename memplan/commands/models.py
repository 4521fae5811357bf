"""What the commands that build and run a model share: the user's own modules importable from
the working folder, and a model too large for memory said in one line."""

from __future__ import annotations

import contextlib
import sys

from ..errors import MemplanError, is_allocation_failure


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

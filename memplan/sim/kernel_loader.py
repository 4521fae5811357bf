"""Which copy of the simulator's kernel (_kernel.py) runs: compiled by numba, or the same code interpreted.

Loading the compiled kernel costs most of a second per process (importing numba, then its
cached machine code), while the interpreter runs one simulation of a few thousand ops in a
few milliseconds. A search planner simulates thousands of times and wants the compiled
kernel; a command that simulates once (`memplan pool --plan`, whose `--time-limit` covers
the whole command) wants the interpreted one, unless this process has the compiled one
already.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_COMPILED = f"{__package__}._kernel"
_SOURCE = Path(__file__).with_name("_kernel.py")


def compiled() -> ModuleType:
    """The kernel compiled by numba (imported on first use)."""
    return importlib.import_module(_COMPILED)


@functools.cache
def interpreted() -> ModuleType:
    """A second copy of the kernel module whose functions stay plain Python: it is loaded while
    numba is hidden, so its `njit` is the fallback that returns each function as it is."""
    spec = importlib.util.spec_from_file_location(f"{__package__}._kernel_interpreted", _SOURCE)
    module = importlib.util.module_from_spec(spec)
    hidden = sys.modules.get("numba")
    sys.modules["numba"] = None  # makes `from numba import njit` raise ImportError
    try:
        spec.loader.exec_module(module)
    finally:
        if hidden is None:
            del sys.modules["numba"]
        else:
            sys.modules["numba"] = hidden
    return module


def for_one_run() -> ModuleType:
    """The compiled kernel where this process has loaded it already, else the interpreted one."""
    return compiled() if _COMPILED in sys.modules else interpreted()

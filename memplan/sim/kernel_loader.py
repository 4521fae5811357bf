"""Which copy of the simulator's kernel (_kernel.py, with its per-plan pass _events.py) runs: compiled
by numba, or the same code interpreted.

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
from types import SimpleNamespace

_MODULES = ("_kernel", "_events")  # each imports nothing of the other (the interpreted copies stay apart)
_COMPILED = f"{__package__}._kernel"


def compiled() -> SimpleNamespace:
    """The kernel compiled by numba (imported on first use): `run_kernel`, and `plan_events`,
    `place_decisions` and `floor_load` of the per-plan pass."""
    return _namespace(importlib.import_module(f"{__package__}.{name}") for name in _MODULES)


@functools.cache
def interpreted() -> SimpleNamespace:
    """Second copies of the kernel's modules whose functions stay plain Python: they are loaded while
    numba is hidden, so their `njit` is the fallback that returns each function as it is."""
    hidden = sys.modules.get("numba")
    sys.modules["numba"] = None  # makes `from numba import njit` raise ImportError
    try:
        return _namespace(_load_plain(name) for name in _MODULES)
    finally:
        if hidden is None:
            del sys.modules["numba"]
        else:
            sys.modules["numba"] = hidden


def for_one_run() -> SimpleNamespace:
    """The compiled kernel where this process has loaded it already, else the interpreted one."""
    return compiled() if _COMPILED in sys.modules else interpreted()


def _load_plain(name: str):
    spec = importlib.util.spec_from_file_location(f"{__package__}.{name}_interpreted",
                                                  Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _namespace(modules) -> SimpleNamespace:
    modules = list(modules)
    return SimpleNamespace(run_kernel=modules[0].run_kernel, plan_events=modules[1].plan_events,
                           place_decisions=modules[1].place_decisions, floor_load=modules[1].floor_load)

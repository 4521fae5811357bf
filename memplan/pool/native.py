"""ctypes bindings of native.c (the allocators' inner loops), built on first use (cbuild.py).

`library()` builds the library once per source version and machine (about a second; the first
smartpool call on a machine pays it inside its time limit unless `memplan.pool.native.library()`
built it ahead, e.g. after an install) and loads it once per process (a millisecond). ctypes releases the GIL during every call, so
searches on several threads run in parallel.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from .cbuild import build_library

SOURCE = Path(__file__).with_name("native.c")
_I64 = ctypes.c_int64
_P = ctypes.POINTER(ctypes.c_int64)
_P32 = ctypes.POINTER(ctypes.c_int32)


class Problem(ctypes.Structure):
    """mp_problem: the static arrays of one search problem (see native.c)."""

    _fields_ = [(name, _I64) for name in ("n", "sections", "nkeys", "t_row")] + [
        (name, _P) for name in ("sizes", "indptr", "sec_lo", "sec_hi", "sec_ptr", "sec_members", "by_lo", "lo_ptr",
                                "twin", "keys", "section_total", "cuts")] + [("indices", _P32)]


_SIGNATURES = {
    "mp_conflict_count": (_I64, [_I64, _P, _P, _P, _P]),
    "mp_conflict_fill": (None, [_I64, _P, _P, _P, _P, _P32]),
    "mp_greedy": (_I64, [_I64, _P, _P, _P, _P32, ctypes.c_int, _P]),
    "mp_search_new": (ctypes.c_void_p, [ctypes.POINTER(Problem), _I64]),
    "mp_search_free": (None, [ctypes.c_void_p]),
    "mp_search_nodes": (_I64, [ctypes.c_void_p]),
    "mp_search_offsets": (None, [ctypes.c_void_p, _P]),
    "mp_search_advance": (ctypes.c_int, [ctypes.c_void_p, _I64, _P, _I64]),
    "mp_dive": (_I64, [_I64, _I64, _P, _P, _P, _P, _I64, _P]),
    "mp_sweep_fit": (_I64, [_I64, _P, _P, _P, _P, _P, ctypes.c_int, _P]),
}


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded library (built first if needed).

    Raises:
        MemplanError: no C compiler, or compilation failed.
    """
    lib = ctypes.CDLL(str(build_library(SOURCE, "memplan_pool")))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def ptr(array: np.ndarray):
    """A ctypes pointer to a C-contiguous int64 or int32 array (the caller keeps the array alive)."""
    assert array.dtype in (np.int64, np.int32) and array.flags.c_contiguous
    return array.ctypes.data_as(_P if array.dtype == np.int64 else _P32)


def i64(array) -> np.ndarray:
    """`array` as a C-contiguous int64 numpy array (a copy only when needed)."""
    return np.ascontiguousarray(array, dtype=np.int64)

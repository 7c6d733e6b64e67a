"""A DLPack capsule the Python backend stub consumed, marked consumed by the DLPack spec's name.

`pb_utils.Tensor.from_dlpack` takes the tensor out of the capsule and renames it "used_dlpack"; the
spec's name for a consumed capsule is "used_dltensor", the only one numpy's capsule destructor leaves
alone. On any other name numpy 1.26's destructor (nvidia-pytriton 0.7 pins numpy below 2) cannot read
the capsule, and reports that as unraisable with the capsule it is destroying as the report's
object: the report takes a reference, dropping it destroys the capsule again, and so on until the
thread's stack overflows. The stub died of it (SIGSEGV in libpython) at the first response it sent,
and every request after that was answered "Stub process is not healthy" (seen on a 2-core Xeon, where
tests/triton failed throughout; what spared the machines before, with the same packages, is not
known). Each output tensor is handed over as a capsule of our own, renamed once the stub has taken
it, so the destructor returns at once.
"""

from __future__ import annotations

import ctypes
from typing import Any

# PyCapsule_SetName keeps the pointer, not a copy: the name must outlive every capsule (a constant).
_CONSUMED = b"used_dltensor"
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name.restype = ctypes.c_int


def mark_consumed(capsule: Any) -> None:
    """Name `capsule` (one a consumer took the tensor from) as the DLPack spec names a consumed one.
    ValueError (Python's own, through ctypes) where it is not a capsule."""
    _set_name(capsule, _CONSUMED)

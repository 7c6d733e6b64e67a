"""A DLPack capsule the backend stub consumed (renamed "used_dlpack", its way) and then marked
consumed by the spec's name is left alone by numpy's destructor. Unmarked, numpy 1.26's destructor
reported it as unraisable with the dying capsule as the report's object, recursing until the stack
overflowed: the stub died at its first response (gpu_container/triton/cpu/dlpack_capsule.py).
Run in a fresh interpreter: the failure it guards against is a crash, or a report on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_container.triton.cpu.dlpack_capsule import mark_consumed
from tests.iac.terraform_env import REPO

_DROP = """
import ctypes, gc, sys
import numpy as np
from gpu_container.triton.cpu.dlpack_capsule import mark_consumed

array = np.arange(16, dtype=np.int32)
capsule = array.__dlpack__()
# What pb_utils.Tensor.from_dlpack does to a capsule it takes the tensor from.
set_name = ctypes.pythonapi.PyCapsule_SetName
set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
STUB_NAME = b"used_dlpack"
assert set_name(capsule, STUB_NAME) == 0
mark_consumed(capsule)
del capsule
gc.collect()
assert array.sum() == 120  # the array itself untouched
print("dropped")
"""


def test_a_capsule_the_stub_consumed_is_dropped_without_a_report() -> None:
    done = subprocess.run([sys.executable, "-c", _DROP], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "dropped"
    assert done.stderr == "", done.stderr[-2000:]


def test_only_a_capsule_is_marked() -> None:
    with pytest.raises(ValueError, match="PyCapsule"):
        mark_consumed(object())

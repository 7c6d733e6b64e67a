"""Import progress on stderr: a person waiting on a first start sees it move."""

from __future__ import annotations

import sys
from collections.abc import Callable

# (tensors done, tensors in all, the tensor just done)
Progress = Callable[[int, int, str], None]


def stderr_progress(label: str) -> Progress:
    """One overwritten line on a terminal; on a pipe or log, a line at each tenth."""
    last_tenth = -1

    def report(done: int, total: int, tensor: str) -> None:
        nonlocal last_tenth
        percent = 100 * done // max(total, 1)
        if sys.stderr.isatty():
            end = "\n" if done == total else ""
            sys.stderr.write(f"\rimporting {label}: {percent:3d}% ({done}/{total} tensors) {tensor:<32}{end}")
        elif percent // 10 != last_tenth:
            last_tenth = percent // 10
            sys.stderr.write(f"importing {label}: {percent}% ({done}/{total} tensors)\n")
        sys.stderr.flush()

    return report

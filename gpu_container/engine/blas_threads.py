"""How many threads numpy's BLAS may use in this process.

On the tiny models this engine runs, one BLAS thread beats two: the matrices are too small to pay
for the hand-offs, and a 2-core box also runs the event loop. Measured with the demo model on 2
cores, single-thread vs OpenBLAS's default of 2: batch 1 about the same, batch 8 1.4x faster,
batch 32 3.6x faster. threadpoolctl changes it at run time; without it, set OPENBLAS_NUM_THREADS=1
(and OMP_NUM_THREADS / MKL_NUM_THREADS for other BLAS builds) before the process starts.
"""

from __future__ import annotations

import importlib.util
import os

import structlog

log = structlog.get_logger(__name__)


def limit_blas_threads(threads: int) -> bool:
    """Cap BLAS at `threads` for the whole process (BLAS pools are process-wide); False if unable."""
    if importlib.util.find_spec("threadpoolctl") is None:
        log.warning(
            "threadpoolctl not installed; set OPENBLAS_NUM_THREADS to limit BLAS threads", wanted=threads
        )
        return False
    import numpy  # noqa: F401  # BLAS must be loaded for threadpoolctl to find it
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")
    return True


def usable_cpus() -> int:
    """The cores this process may run on (its affinity, as a container's cpuset limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

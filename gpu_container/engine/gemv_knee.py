"""Where one GEMV per row stops beating one GEMM for a few rows: measured on the machine, at start.

The knee is a property of the BLAS build and the CPU, not of the code. On the AMD EPYC the engine
was first measured on, OpenBLAS's GEMM for a few rows against a wide matrix cost several GEMV
passes whatever the row count (its packing) while each GEMV re-read the matrix from the last-level
cache: the two met at about 16 rows. On an Intel Xeon with the same OpenBLAS (its Prescott
kernels there), thread CPU time for the 576x3072 gate/up matrix: 2 rows 935 us as GEMVs against
1,038 as a GEMM, 4 rows 1,859 against 1,311, 16 rows 7,374 against 2,343; the knee measured there
is 2-3, and against a knee fixed at 16 it decodes 4 and 16 streams at 1.6x and 2.1x the tokens per
CPU second (docs/bench-engine-knee.md).

So the engine times `linear` both ways on the model's widest projection (the gate/up matrix: the
most bytes per row, where the choice costs most) for 2..MAX_KNEE_ROWS rows and keeps the largest
row count up to which the GEMVs win at every count. A few rounds, keeping the least of each time
(a busy moment on a shared machine only ever adds), the two ways interleaved so that a busy moment
falls on both alike: about 40 ms of CPU time on the Xeon (knee 2-3), about 0.4 s there if every
row count up to 16 is timed (where the GEMVs win up to 16 rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpu_container.engine.arrays import Floats
from gpu_container.engine.model import MAX_KNEE_ROWS, LlamaModel, linear

Clock = Callable[[], float]


def crossover(gemv_s: Sequence[float], gemm_s: Sequence[float]) -> int:
    """The knee from times indexed by row count - 1 (index 0 is one row, where both are a GEMV):
    the largest row count up to which the GEMVs win at every count, 1 when a GEMM wins at two."""
    knee = 1
    for rows in range(2, min(len(gemv_s), len(gemm_s)) + 1):
        if gemv_s[rows - 1] >= gemm_s[rows - 1]:
            break
        knee = rows
    return knee


def measure_knee(weight: Floats, clock: Clock, max_rows: int = MAX_KNEE_ROWS, rounds: int = 3) -> int:
    """The knee for this [in, out] matrix, timed with `clock` (the engine's step clock).

    A round stops two row counts past the knee it has seen so far: beyond it the GEMVs cost a row
    each and lose by more with every row, and timing them would make most of the start-up cost on
    a machine with a low knee."""
    x = np.random.default_rng(0).standard_normal((max_rows, weight.shape[0])).astype(np.float32)
    gemv = [float("inf")] * max_rows
    gemm = [float("inf")] * max_rows
    for _ in range(rounds):
        for rows in range(2, max_rows + 1):
            if rows > crossover(gemv, gemm) + 2:
                break
            for times, knee in ((gemv, max_rows), (gemm, 1)):
                start = clock()
                linear(x[:rows], weight, knee)
                times[rows - 1] = min(times[rows - 1], clock() - start)
    return crossover(gemv, gemm)


def model_knee(model: LlamaModel, clock: Clock) -> int:
    """The knee measured on the model's widest projection (first layer's: all layers share shapes)."""
    layer = model.weights.layers[0]
    widest = max((layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj), key=lambda w: w.size)
    return measure_knee(widest, clock)

"""Array types the engine passes around."""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

Floats: TypeAlias = npt.NDArray[np.float32]
Ints: TypeAlias = npt.NDArray[np.int64]

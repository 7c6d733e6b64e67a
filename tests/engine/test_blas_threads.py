"""Starting an engine caps numpy's BLAS pool at EngineConfig.blas_threads (0: left alone)."""

from __future__ import annotations

import pytest

from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig
from tests.engine.tiny_llama import tiny_model

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"}


@pytest.mark.parametrize("wanted", [0, 1])
def test_engine_start_sets_blas_threads(wanted: int) -> None:
    threadpoolctl.threadpool_limits(limits=2, user_api="blas")
    engine = LLMEngine(tiny_model()[0], EngineConfig(num_blocks=8, blas_threads=wanted), eos_token_ids=[1])
    engine.start()
    try:
        seen = _blas_threads()
    finally:
        engine.stop()
        threadpoolctl.threadpool_limits(limits=1, user_api="blas")
    assert seen == ({2} if wanted == 0 else {wanted})

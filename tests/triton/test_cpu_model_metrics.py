"""The CPU model publishes each stats snapshot counter first, gauges after.

Regression (issue 13): test_concurrent_streams_share_the_engine_batch counted 620 generated tokens
for 20 x 32 on a loaded machine. The test waits on the gauges (idle, iterations advanced) and then
reads the counter; each metric write is its own IPC call to tritonserver and a scrape can land
between two, and the counter was written after the gauges, so a scrape could show the final
snapshot's gauges with the previous step's count (the last step's 20 tokens missing).

Outside tritonserver's Python backend the metrics API (triton_python_backend_utils) does not exist,
so the test gives the model a stand-in that records the order of the writes; the end-to-end check
on a real tritonserver is the batch test in test_triton_upstream.py.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_container.engine.types import EngineStats

# Every metric write the model makes, in order: (metric family, labels, value).
WRITES: list[tuple[str, str, float]] = []


class _Metric:
    def __init__(self, family: _MetricFamily, labels: dict[str, str]) -> None:
        self._name = family.name
        self._labels = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    def set(self, value: float) -> None:
        WRITES.append((self._name, self._labels, value))

    def increment(self, value: float) -> None:
        WRITES.append((self._name, self._labels, value))


class _MetricFamily:
    GAUGE = "gauge"
    COUNTER = "counter"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str]) -> _Metric:  # the backend's own name
        return _Metric(self, labels)


@pytest.fixture
def cpu_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    stand_in = types.ModuleType("triton_python_backend_utils")
    stand_in.MetricFamily = _MetricFamily  # type: ignore[attr-defined]
    stand_in.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stand_in)
    monkeypatch.delitem(sys.modules, "gpu_container.triton.cpu.engine_model", raising=False)
    module = importlib.import_module("gpu_container.triton.cpu.engine_model")
    yield module
    sys.modules.pop("gpu_container.triton.cpu.engine_model", None)


def _stats(*, running: int, free_blocks: int, steps: int, generated: int) -> EngineStats:
    return EngineStats(
        block_size=16,
        num_blocks=64,
        free_blocks=free_blocks,
        max_num_seqs=32,
        running=running,
        waiting=0,
        steps=steps,
        prompt_tokens=100,
        generated_tokens=generated,
    )


def test_the_token_count_is_written_before_the_gauges_of_its_snapshot(cpu_model: Any) -> None:
    metrics = cpu_model._Metrics("tensorrt_llm", "1")
    metrics.update(_stats(running=20, free_blocks=24, steps=31, generated=620), answering=20)
    WRITES.clear()

    # The last step: every stream got its 32nd token and finished; the pool is free again.
    metrics.update(_stats(running=0, free_blocks=64, steps=32, generated=640), answering=0)

    names = [name for name, _, _ in WRITES]
    assert names[0] == cpu_model.GENERATED_TOKENS_METRIC, names
    assert WRITES[0][2] == 20
    # And the gauges a reader waits on come after it.
    assert {"nv_trt_llm_request_metrics", "nv_trt_llm_general_metrics"} <= set(names[1:])

"""The CPU model publishes each stats snapshot counter first, gauges after; and a final response
counts as unsent on its page until it is out.

Regression (issue 13): test_concurrent_streams_share_the_engine_batch counted 620 generated tokens
for 20 x 32 on a loaded machine. The test waits on the gauges (idle, iterations advanced) and then
reads the counter; each metric write is its own IPC call to tritonserver and a scrape can land
between two, and the counter was written after the gauges, so a scrape could show the final
snapshot's gauges with the previous step's count (the last step's 20 tokens missing).

Outside tritonserver's Python backend the metrics API (triton_python_backend_utils) does not exist,
so the test gives the model a stand-in that records the order of the writes (and of the sends);
the end-to-end checks on a real tritonserver are the batch test in test_triton_upstream.py and the
stops in test_launcher.py.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest

from edge.upstreams.base import GenerationRequest
from edge.upstreams.triton import generate_body
from gpu_container.engine.types import EngineStats
from gpu_container.triton.trtllm_metrics import REQUEST_FAMILY, UNSENT_RESPONSES_METRIC
from tests.support.live_server import demo_model_dir
from tests.support.triton_server import ENGINE_CONFIG
from tests.triton.test_contract import _as_model_sees_it

# Every metric write the model makes, in order: (metric family, labels, value).
WRITES: list[tuple[str, str, float]] = []
# While set, every gauge write raises, as a failed IPC to the server would.
FAILING = threading.Event()


class _Metric:
    def __init__(self, family: _MetricFamily, labels: dict[str, str]) -> None:
        self._name = family.name
        self._labels = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    def set(self, value: float) -> None:
        if FAILING.is_set():
            raise RuntimeError("metrics IPC failed")
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


class _Tensor:
    @staticmethod
    def from_dlpack(name: str, array: Any) -> tuple[str, Any]:
        return name, array


@pytest.fixture
def cpu_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    WRITES.clear()
    FAILING.clear()
    stand_in = types.ModuleType("triton_python_backend_utils")
    stand_in.MetricFamily = _MetricFamily  # type: ignore[attr-defined]
    stand_in.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    stand_in.Tensor = _Tensor  # type: ignore[attr-defined]
    stand_in.InferenceResponse = lambda **fields: fields  # type: ignore[attr-defined]
    # The model sets the process's structlog and unraisable hook, as it may inside tritonserver.
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr("gpu_container.plain_logging.configure_plain_logging", lambda: None)
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
    metrics.update(_stats(running=20, free_blocks=24, steps=31, generated=620), live=20, unsent=20)
    WRITES.clear()

    # The last step: every stream got its 32nd token and finished; the pool is free again.
    metrics.update(_stats(running=0, free_blocks=64, steps=32, generated=640), live=0, unsent=0)

    names = [name for name, _, _ in WRITES]
    assert names[0] == cpu_model.GENERATED_TOKENS_METRIC, names
    assert WRITES[0][2] == 20
    # And the gauges a reader waits on come after it.
    assert {"nv_trt_llm_request_metrics", "nv_trt_llm_general_metrics"} <= set(names[1:])


def _last(name: str, label: str = "") -> float | None:
    """The value last written to metric `name` (the sample whose labels hold `label`)."""
    values = [value for metric, labels, value in WRITES if metric == name and label in labels]
    return values[-1] if values else None


class _Input:
    """A request input as the backend hands it over: a name and DLPack."""

    def __init__(self, name: str, array: Any) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()


class _Sender:
    """Records, at each final response, what the page said while it was being sent."""

    def __init__(self, fail_metrics_from_first_token: bool = False) -> None:
        self.at_final: dict[str, float | None] = {}
        self.done = threading.Event()
        self._fail = fail_metrics_from_first_token

    def send(self, response: Any = None, flags: int = 0) -> None:
        if self._fail:
            FAILING.set()
        if flags:
            self.at_final = {
                "unsent": _last(UNSENT_RESPONSES_METRIC),
                "active": _last(REQUEST_FAMILY, "request_type=active"),
            }
            self.done.set()


class _Request:
    def __init__(self, body: dict[str, Any], sender: _Sender) -> None:
        self._inputs = [_Input(name, np.ascontiguousarray(a)) for name, a in _as_model_sees_it(body).items()]
        self._id, self._sender = body["id"], sender

    def inputs(self) -> list[_Input]:
        return self._inputs

    def request_id(self) -> str:
        return str(self._id)

    def get_response_sender(self) -> _Sender:
        return self._sender

    def is_cancelled(self) -> bool:
        return False


def test_a_final_response_counts_as_unsent_on_the_page_until_it_is_out(cpu_model: Any) -> None:
    """A stop waits for the page to say no final response is left to send (TritonUpstream.wait_idle):
    the Python backend counts no decoupled request as in flight, and SIGTERM during a send crashed
    tritonserver. A final response with no client left to read it (a stream cut as it finished on
    its own) looked like any other: the page went idle before its send. The client who has a final
    response still finds `active` at 0 (the page's readers count on it)."""
    model = _engine_model(cpu_model)
    sender = _Sender()
    try:
        model.execute([_Request(generate_body(GenerationRequest("short", [11, 42, 7], 3)), sender)])
        assert sender.done.wait(30)
    finally:
        model.finalize()  # joins the sender thread: its last publish is written
    assert sender.at_final == {"unsent": 1, "active": 0}
    assert _last(UNSENT_RESPONSES_METRIC) == 0


def _engine_model(cpu_model: Any) -> Any:
    """The CPU model over the demo checkpoint, its watcher's metrics refresh out of the way."""
    parameters = {
        **{k: str(v) for k, v in msgspec.structs.asdict(ENGINE_CONFIG).items()},
        "model_dir": str(demo_model_dir()),
        "metrics_period_ms": "600000",
    }
    config = {
        "parameters": {key: {"string_value": value} for key, value in parameters.items()},
        # As Triton hands over the shipped config.pbtxt's (the model refuses streaming without it).
        "model_transaction_policy": {"decoupled": True},
    }
    return cpu_model.EngineModel(
        {"model_config": json.dumps(config), "model_name": "tensorrt_llm", "model_version": "1"}
    )


def test_a_failing_metrics_write_costs_no_response(cpu_model: Any) -> None:
    """The sender thread publishes around a final send: a write that raised there ended the thread
    (the final response never went, and no later request was answered)."""
    model = _engine_model(cpu_model)
    try:
        first = _Sender(fail_metrics_from_first_token=True)
        model.execute([_Request(generate_body(GenerationRequest("first", [11, 42, 7], 3)), first)])
        assert first.done.wait(10)
        FAILING.clear()
        second = _Sender()
        model.execute([_Request(generate_body(GenerationRequest("second", [11, 42, 7], 3)), second)])
        assert second.done.wait(10)
    finally:
        model.finalize()
    assert _last(UNSENT_RESPONSES_METRIC) == 0


class _HeldFinal(_Sender):
    """Holds its final send until `release` is set, as a slow IPC to the server would."""

    def __init__(self) -> None:
        super().__init__()
        self.in_final = threading.Event()
        self.release = threading.Event()

    def send(self, response: Any = None, flags: int = 0) -> None:
        if flags:
            self.in_final.set()
            self.release.wait(30)
        super().send(response, flags)


def test_a_request_admitted_while_a_final_is_still_going_out_is_on_the_page(cpu_model: Any) -> None:
    """The page went idle as the last live request ended, before its final send; a request
    admitted before that send was out did not publish (the unsent count was not 0 to 1), and the
    page said no request was active while it held tokens: under load the launcher's SIGTERM test
    read active 0 there."""
    model = _engine_model(cpu_model)
    first = _HeldFinal()
    try:
        model.execute([_Request(generate_body(GenerationRequest("first", [11, 42, 7], 3)), first)])
        assert first.in_final.wait(30)
        assert _last(REQUEST_FAMILY, "request_type=active") == 0  # idle as "first" ended
        second = _Sender()
        model.execute([_Request(generate_body(GenerationRequest("second", [11, 42, 7], 3)), second)])
        assert _last(REQUEST_FAMILY, "request_type=active") == 1
        first.release.set()
        assert second.done.wait(30)
    finally:
        first.release.set()
        model.finalize()
    assert _last(UNSENT_RESPONSES_METRIC) == 0

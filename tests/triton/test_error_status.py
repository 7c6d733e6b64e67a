"""How a Triton replica's error is classified when the model itself sent it, against a real
tritonserver.

Triton's HTTP `generate` and `generate_stream` (2.51 here; 2.53 in the production image, and on to
at least 2.59) take the HTTP status of a model's error from the error after they have freed it
(http_server.cc: AddErrorJson deletes it, then HttpCodeFromError reads it): whatever code the
model sent, INTERNAL included, the status says nothing. TensorRT-LLM answers every error
INTERNAL, its engine's failures too; read as INVALID_ARGUMENT, each was the user's 400.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.upstreams.base import GenerationRequest, RequestRejected, UpstreamError
from edge.upstreams.triton import TritonUpstream
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from gpu_container.triton.refusals import REFUSED
from tests.support.live_server import demo_model_dir

# How TensorRT-LLM's backend reports a failed engine step (model_instance_state.cc wraps it).
STEP_FAILURE = (
    "Executor failed process requestId 3 due to the following error: Encountered an error in "
    "forwardAsync function: [TensorRT-LLM][ERROR] CUDA runtime error in cudaMemcpyAsync: an illegal "
    "memory access was encountered (/src/cudaUtils.h:101)"
)

# A model behind the edge's tensor contract (the CPU model's config.pbtxt) that answers every
# request with one error: the message and Triton code of the request's first prompt token.
_ANSWERING_MODEL = f"""
import triton_python_backend_utils as pb_utils

ERRORS = {{
    1: ({STEP_FAILURE!r}, "INTERNAL"),
    2: ({REFUSED + "top_k 5000 is more than this engine takes"!r}, "INVALID_ARG"),
}}


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            first = int(pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)[0])
            message, name = ERRORS[first]
            code = getattr(pb_utils.TritonError, name)
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def erring_triton() -> Iterator[TritonProcess]:
    with tempfile.TemporaryDirectory(prefix="erring-repo-") as repo:
        rendered = render_cpu_repository(Path(repo), demo_model_dir(), EngineConfig(num_blocks=16))
        (rendered / "tensorrt_llm" / "1" / "model.py").write_text(_ANSWERING_MODEL)
        process = start_local_triton(rendered)
        try:
            yield process
        finally:
            process.stop()


async def _first_error(triton: TritonProcess, first_token: int) -> BaseException:
    upstream = TritonUpstream("erring", triton.http_url, triton.metrics_url, end_id=2, pad_id=2)
    try:
        with pytest.raises((UpstreamError, RequestRejected)) as raised:
            async for _ in upstream.generate(GenerationRequest("r", [first_token, 5, 6], max_new_tokens=4)):
                pass
        return raised.value
    finally:
        await upstream.aclose()


@pytest.mark.anyio
async def test_an_engine_failure_the_model_reports_is_the_replicas_whatever_the_http_status(
    erring_triton: TritonProcess,
) -> None:
    error = await _first_error(erring_triton, 1)
    assert isinstance(error, UpstreamError), error
    assert "forwardAsync" in str(error)


@pytest.mark.anyio
async def test_a_refusal_the_model_reports_is_still_the_requests(erring_triton: TritonProcess) -> None:
    error = await _first_error(erring_triton, 2)
    assert isinstance(error, RequestRejected), error
    assert str(error) == "top_k 5000 is more than this engine takes"

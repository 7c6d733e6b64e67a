"""Telling a replica's refusal of a request (its own fault) from the replica's failure, on the texts
the two servers really send: our CPU model's, and TensorRT-LLM's backend's (built the way its
sources build them: a TllmException's first line ends in "(file:line)", then a backtrace)."""

from __future__ import annotations

import pytest

from gpu_container.triton.refusals import REFUSED, exceeds_context, refusal_reason

_BACKTRACE = (
    "\n1       0x7f3a2b1c4d5e tensorrt_llm::common::throwRuntimeError(char const*, int, std::string const&)"
)


def _executor_error(inner: str) -> str:
    """How the backend wraps an executor response's error (model_instance_state.cc)."""
    return f"Executor failed process requestId 17 due to the following error: {inner}"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            f"{REFUSED}prompt has 5000 tokens, max_model_len is 2048",
            "prompt has 5000 tokens, max_model_len is 2048",
        ),
        (
            _executor_error(
                "Encountered an error when fetching new request: [TensorRT-LLM][ERROR] Prompt length "
                "(5000) exceeds maximum input length (4096). Set log level to info and check TRTGptModel "
                "logs for how maximum input length is set (/src/batch_manager/llmRequest.cpp:312)"
                + _BACKTRACE
            ),
            "Prompt length (5000) exceeds maximum input length (4096). Set log level to info and check "
            "TRTGptModel logs for how maximum input length is set",
        ),
        (
            _executor_error(
                "Encountered an error when fetching new request: [TensorRT-LLM][ERROR] Assertion failed: "
                "EndId (200000) is not within acceptable range [-1, 128256). (/src/llmRequest.cpp:280)"
                + _BACKTRACE
            ),
            "Assertion failed: EndId (200000) is not within acceptable range [-1, 128256).",
        ),
        (
            "[TensorRT-LLM][ERROR] Assertion failed: topP.value() > 0.f "
            "(/src/cpp/tensorrt_llm/executor/samplingConfig.cpp:301)" + _BACKTRACE,
            "Assertion failed: topP.value() > 0.f",
        ),
    ],
    ids=["cpu-model", "trtllm-prompt-too-long", "trtllm-end-id", "trtllm-sampling"],
)
def test_a_refusal_gives_its_reason_without_wrappers_or_backtrace(message: str, reason: str) -> None:
    assert refusal_reason(message) == reason


@pytest.mark.parametrize(
    "message",
    [
        "engine is stopped",
        "Engine step failed: out of memory",
        _executor_error(
            "Encountered an error in forwardAsync function: [TensorRT-LLM][ERROR] CUDA runtime error in "
            "cudaMemcpyAsync: an illegal memory access was encountered (/src/cudaUtils.h:101)" + _BACKTRACE
        ),
        # A step failure is the replica's even when its text happens to name a request check.
        _executor_error(
            "Encountered an error in forwardSync function: Prompt length (9) exceeds maximum input length (8)"
        ),
        "Request for unknown model: 'tensorrt_llm' is not found",
        # The backend's checks of inputs the edge sends with every request: the replica's model (its
        # config not decoupled, an input it does not take) differs from the edge's contract.
        "[TensorRT-LLM][ERROR] Streaming is only supported if model is deployed using decoupled mode. "
        "(/src/inflight_batcher_llm/src/utils.cc:666)" + _BACKTRACE,
        "request_output_len is not present in the request",
        "[TensorRT-LLM][ERROR] inputTokens or encoderInputFeatures tensor not provided "
        "(/src/inflight_batcher_llm/src/utils.cc:124)" + _BACKTRACE,
    ],
    ids=[
        "stopped",
        "step-error",
        "trtllm-forward-async",
        "trtllm-forward-sync",
        "unknown-model",
        "trtllm-not-decoupled",
        "trtllm-missing-output-len",
        "trtllm-missing-input-ids",
    ],
)
def test_a_replica_failure_is_not_a_refusal(message: str) -> None:
    assert refusal_reason(message) is None


@pytest.mark.parametrize(
    "message",
    [
        "parameter 'return_kv_cache_reuse_stats' has invalid type. "
        "It should be either 'int', 'bool', or 'string'.",
        "[request id: 7] unexpected shape for input 'input_ids' for model 'tensorrt_llm'. "
        "Expected [-1], got [2,2]",
        "[request id: 7] unexpected inference input 'return_kv_cache_reuse_stats' for model 'tensorrt_llm'",
        "[request id: 7] expected 3 inputs but got 4 inputs for model 'tensorrt_llm'",
        "[request id: 7] inference input 'temperature' data-type is 'FP64', "
        "but model 'tensorrt_llm' expects 'FP32'",
    ],
    ids=["undeclared-input", "shape", "unexpected-input", "input-count", "datatype"],
)
def test_tritons_own_input_checks_are_the_replicas_failure(message: str) -> None:
    """Triton's 400s for inputs its model's config does not take as the edge sends them: the
    edge's contract and the replica's model differ, which no user's request causes."""
    assert refusal_reason(message) is None


def test_any_other_invalid_argument_is_still_the_requests_refusal() -> None:
    """Read as the replica's failure, a request refused in words this module does not know would
    mark every replica it is tried on suspect: one user sending it again and again would keep the
    fleet out of rotation. Only Triton's own input checks are the replica's."""
    assert refusal_reason("top_p 1e-39 is not a value this build takes", invalid_argument=True) == (
        "top_p 1e-39 is not a value this build takes"
    )
    assert refusal_reason("top_p 1e-39 is not a value this build takes") is None


def test_a_contract_mismatch_naming_an_input_the_request_asked_for_is_its_refusal() -> None:
    """An optional input the edge sends only for a parameter the request set (presence_penalty):
    a model that does not declare it refuses that request alone; any other input is the replica's."""
    message = "parameter 'presence_penalty' has invalid type. It should be either 'int', 'bool', or 'string'."
    reason = refusal_reason(message, invalid_argument=True, requested_inputs={"presence_penalty"})
    assert reason is not None and "does not take presence_penalty" in reason
    assert refusal_reason(message, invalid_argument=True, requested_inputs={"min_length"}) is None
    assert refusal_reason(message, invalid_argument=True) is None


@pytest.mark.parametrize(
    ("reason", "too_long"),
    [
        ("prompt has 5000 tokens, max_model_len is 2048", True),
        ("prompt has 5000 tokens, this engine holds at most 4096", True),
        (
            "Prompt length (5000) exceeds maximum input length (4096). Set log level to info and check "
            "TRTGptModel logs for how maximum input length is set",
            True,
        ),
        ("Assertion failed: EndId (200000) is not within acceptable range [-1, 128256).", False),
        ("Assertion failed: topP.value() > 0.f", False),
        ("prompt has token ids outside [0, 32000)", False),
    ],
    ids=["cpu-model", "cpu-engine-pool", "trtllm", "trtllm-end-id", "trtllm-sampling", "cpu-vocab"],
)
def test_a_refusal_of_the_prompts_length_is_told_from_the_others(reason: str, too_long: bool) -> None:
    """A prompt longer than the replica holds, which the edge could not refuse first (the replica
    did not say its limit, or TensorRT-LLM's --max-input-len is below its --max-seq-len): the
    client must get the code it trims its history on, not a bare 400."""
    assert exceeds_context(reason) is too_long

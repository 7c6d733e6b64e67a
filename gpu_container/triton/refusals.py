"""Which errors a Triton replica answers are the request's own fault (a refusal), not the replica's.

A refused request must be answered 400 for that request alone; any other error marks the replica
suspect and costs every user on it. On a stream Triton reports a request's error as a bare
message (an `error` event of HTTP `generate_stream`, which the edge reads; an `error_message` on
gRPC's `ModelStreamInfer`): the backend's status code (INVALID_ARG, INTERNAL...) could travel only
as the HTTP status of an error that came before any token, and does not (below). So a refusal is
known by its text, and the two servers of the `tensorrt_llm` contract word theirs differently:

* Our CPU model (gpu_container/triton/cpu/engine_model.py) starts the message with REFUSED and
  sends it with Triton's INVALID_ARG code.
* TensorRT-LLM's backend answers every error INTERNAL (inflight_batcher_llm
  model_instance_state.cc), so its refusals are known by the phrases of its checks: those of
  `LlmRequest::validate` and `SamplingConfig` that run when the executor takes a new request
  ("Encountered an error when fetching new request: ...", wrapped in "Executor failed process
  requestId N due to the following error: ...") and the backend's own checks of the input tensors
  when it enqueues. An error in the executor's step ("... in forwardAsync function") ends every
  request on the replica: always the replica's fault.

Nor does the HTTP status of a model's own error say its code, whatever the model sent: Triton's
`generate` and `generate_stream` (2.51 to at least 2.59, the production image's 2.53 among them)
read the status from the error after freeing it (http_server.cc: AddErrorJson deletes it before
HttpCodeFromError reads it), and answered 400 for INTERNAL and UNAVAILABLE alike here. Such an
error comes framed as the stream's event (`data: {"error": ...}`), where Triton's own checks of the
request answer plain JSON before any model sees it; the edge passes `invalid_argument` only for
those, and knows the model's refusals by their text: every TensorRT-LLM failure before the first
token (an engine step's included) was otherwise the user's 400, the replica never suspect.

Triton >= 2.50 can instead end the stream with the gRPC status (the `triton_grpc_error: true`
header: INVALID_ARG arrives as INVALID_ARGUMENT), but in 2.51 that mode logs an internal error for
every refused request and, in one test run of three, left the model unable to unload at shutdown
(the mode's use-after-free was fixed upstream only in 2026, server PR #8708). The edge does not ask
for it.

A status INVALID_ARGUMENT (HTTP 400) is a refusal whatever its text, but for Triton's own checks
of the inputs against the model's config.pbtxt (CONTRACT_MISMATCHES: "parameter
'return_kv_cache_reuse_stats' has invalid type" for an input the model does not declare,
"unexpected shape for input", a datatype or input count that differs). Those inputs are the edge's,
built to one contract whatever the user sent, so such a 400 says the replica's model differs from
that contract (TensorRT-LLM 0.19 renamed return_kv_cache_reuse_stats return_perf_metrics): every
request it takes gets it. Read as a refusal, every user got a 400 naming nothing of theirs, no
request went on to a healthy replica and the broken one never became suspect. Any other 400 stays
the request's: read as the replica's failure, a request some check refuses in words this module
does not know would mark every replica it is tried on suspect, and one user sending it again and
again would keep the fleet out of rotation.

Not every input is sent to one contract, though: the edge sends the optional ones (presence_penalty,
embedding_bias...) only for a request that sets the parameter, so a model repository that does not
declare them serves every other request. A mismatch naming one of those (`requested_inputs`) is
that request's refusal: the replica serves everyone else, and read as its failure one user sending
the parameter again and again would keep every such replica out of rotation, and be told to retry
(502, Retry-After) a request no replica can serve.

A refusal of the prompt's length (`exceeds_context`) is a ContextLengthExceeded: the edge answers it
as its own refusal of a prompt past the context, with the code `context_length_exceeded` that a
client trims its history on. It meets one where the replica did not say its limit, or where
TensorRT-LLM's --max-input-len is below the --max-seq-len it says (docs/deploy.md).
"""

from __future__ import annotations

import re
from collections.abc import Collection

# How our CPU model's refusals begin.
REFUSED = "request refused: "

# Phrases of TensorRT-LLM's request checks (cpp/tensorrt_llm/batch_manager/llmRequest.cpp,
# executor/executorImpl.cpp, executor/samplingConfig.cpp; triton_backend utils.cc; the Python
# `tensorrt_llm` model's convert_request).
TRTLLM_REFUSALS = (
    "exceeds maximum input length",  # Prompt length (N) exceeds maximum input length (M)
    "exceeds maximum draft tokens length",
    "exceeds maximum encoder input length",
    "Request sequence length is potentially greater than max input length",
    "is not within acceptable range",  # EndId (N) is not within acceptable range [-1, V)
    "Incorrect sampling config",
    "samplingConfig.cpp",  # a SamplingConfig check (top_p, top_k, temperature, beam width...)
    "An error occurred when processing the input values",  # the Python tensorrt_llm model
)
# Not among them: the backend's checks of what the edge sends with every request (input_ids,
# input_lengths, request_output_len: "... is not present in the request", "... tensor not
# provided"; streaming: "Streaming is only supported if model is deployed using decoupled mode",
# which a model config not decoupled answers every request). Like Triton's own input checks they
# say the replica differs from the contract: read as refusals, every user got a 400 and the replica
# stayed in rotation.
# Triton's own checks of the inputs against the model's config.pbtxt (core infer_request.cc, the HTTP
# frontend's JSON-to-tensor conversion): the edge sends the same inputs for every request, so these
# say the replica's model differs from the edge's contract, never that a user's request is bad.
CONTRACT_MISMATCHES = (
    "has invalid type. It should be",  # an input the model does not declare, read as a parameter
    "unexpected inference input",
    "unexpected shape for input",
    "inputs but got",  # expected N inputs but got M inputs
    "but model",  # inference input 'x' data-type is 'FP64', but model 'm' expects 'FP32'
)
# Refusals of the prompt's length, in the words of TensorRT-LLM's LlmRequest::validate and of our
# engine's checks (gpu_container/engine/engine.py), which the CPU model sends: past TensorRT-LLM's
# --max-input-len, which may be below the --max-seq-len the replica says (docs/deploy.md), or past a
# limit the replica did not say.
_CONTEXT_REFUSAL = re.compile(
    r"exceeds maximum input length|^prompt has \d+ tokens, (?:max_model_len is|this engine holds at most) "
)
# The input a contract mismatch names ("parameter 'x' has invalid type", "unexpected inference
# input 'x'", "unexpected shape for input 'x'", "inference input 'x' data-type is ...").
_NAMED_INPUT = re.compile(r"(?:parameter|input) '([^']*)'")
# A failed engine step: it terminates every active request, so it is never a refusal.
_STEP_FAILURE = "Encountered an error in forward"
_WRAPPERS = re.compile(
    r"^(Executor failed process requestId \d+ due to the following error: )?"
    r"(Encountered an error when fetching new request: )?(\[TensorRT-LLM\]\[ERROR\] )?"
)
# TensorRT-LLM's exceptions end their first line with " (file:line)", then a backtrace.
_SOURCE_LOCATION = re.compile(r" \([^()]*:\d+\)$")


def refusal_reason(
    message: str, *, invalid_argument: bool = False, requested_inputs: Collection[str] = ()
) -> str | None:
    """The reason to give the client when `message` (with HTTP 400 or gRPC INVALID_ARGUMENT when
    `invalid_argument`) is a refusal of the request's own parameters; None for a replica's failure.
    `requested_inputs`: the inputs sent only because this request set their parameter."""
    if message.startswith(REFUSED):
        return message.removeprefix(REFUSED)
    if any(phrase in message for phrase in CONTRACT_MISMATCHES):
        named = _NAMED_INPUT.search(message)
        if named is None or named.group(1) not in requested_inputs:
            return None
        first_line = message.strip().splitlines()[0]
        return f"this deployment's model does not take {named.group(1)} ({first_line})"
    if not invalid_argument and (
        _STEP_FAILURE in message or not any(phrase in message for phrase in TRTLLM_REFUSALS)
    ):
        return None
    first_line = message.strip().splitlines()[0] if message.strip() else "invalid request"
    return _SOURCE_LOCATION.sub("", _WRAPPERS.sub("", first_line))


def exceeds_context(reason: str) -> bool:
    """Whether a refusal's reason (refusal_reason's) is of the prompt's length."""
    return _CONTEXT_REFUSAL.search(reason) is not None

"""The edge's requests against the TensorRT-LLM backend the production image pins.

No GPU here, so the real backend never runs in these tests, and the CPU model speaks whatever
contract we give it: both configs can agree with the edge and all three be wrong. What the pinned
backend reads and writes is therefore written down from its own repository
(triton-inference-server/tensorrtllm_backend v0.16.0, commit ad209ced:
all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt, and inflight_batcher_llm/src/
utils.cc and model_instance_state.cc for what it really reads and writes), and what the edge sends
and our production config declares are held against it. A new image tag fails the first test, so
whoever moves it rereads that backend: from 0.19 the stats flag is `return_perf_metrics` and the
backend writes ten stats outputs, later `random_seed` and `min_length` become `seed` and
`min_tokens` (an old name is then silently ignored).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from edge.upstreams.triton import generate_body
from gpu_container.contract import GenerationRequest
from gpu_container.triton.production.render import TrtLlmSettings, render_repository

PINNED_IMAGE = "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"  # TensorRT-LLM 0.16

# The v0.16.0 tensorrt_llm model's inputs a text-only decoder request can carry, with their types.
BACKEND_INPUTS = {
    "input_ids": "TYPE_INT32",
    "input_lengths": "TYPE_INT32",
    "request_output_len": "TYPE_INT32",
    "end_id": "TYPE_INT32",
    "pad_id": "TYPE_INT32",
    "stop_words_list": "TYPE_INT32",
    "bad_words_list": "TYPE_INT32",
    "embedding_bias": "TYPE_FP32",
    "beam_width": "TYPE_INT32",
    "temperature": "TYPE_FP32",
    "runtime_top_k": "TYPE_INT32",
    "runtime_top_p": "TYPE_FP32",
    "repetition_penalty": "TYPE_FP32",
    "min_length": "TYPE_INT32",
    "presence_penalty": "TYPE_FP32",
    "frequency_penalty": "TYPE_FP32",
    "random_seed": "TYPE_UINT64",
    "return_log_probs": "TYPE_BOOL",
    "return_kv_cache_reuse_stats": "TYPE_BOOL",
    "exclude_input_in_output": "TYPE_BOOL",
    "stop": "TYPE_BOOL",
    "streaming": "TYPE_BOOL",
}
# Written on every response: the two the edge reads tokens from.
ALWAYS_WRITTEN = {"output_ids": "TYPE_INT32", "sequence_length": "TYPE_INT32"}
# Written on every response of a request that set return_kv_cache_reuse_stats (not gated by the
# outputs a request names, as the others are): a config lacking one fails every such response.
STATS_WRITTEN = {
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_reused_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
}

REQUESTS = [
    GenerationRequest("plain", [1, 2, 3], max_new_tokens=8),
    GenerationRequest("greedy", [1, 2, 3], max_new_tokens=8, temperature=0.0),
    GenerationRequest(
        "everything",
        [1, 2, 3],
        max_new_tokens=8,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=-5,
        stop_ids=[7, 9],
        presence_penalty=0.5,
        repetition_penalty=1.2,
        frequency_penalty=0.3,
        logit_bias=((4, 2.0),),
        min_tokens=2,
    ),
]


def _production_config(tmp_path: Path) -> model_config_pb2.ModelConfig:
    text = (render_repository(tmp_path, TrtLlmSettings()) / "config.pbtxt").read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _type_name(data_type: int) -> str:
    return model_config_pb2.DataType.Name(data_type)  # type: ignore[no-any-return]


def test_the_image_pins_the_backend_these_tables_were_read_from() -> None:
    dockerfile = Path(__file__).parents[2] / "gpu_container" / "triton" / "Dockerfile"
    assert re.findall(r"^FROM (\S+)", dockerfile.read_text(), re.M) == [PINNED_IMAGE]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: r.request_id)
@pytest.mark.parametrize("end_id", [2, -1])
def test_every_input_the_edge_sends_is_one_the_backend_reads_with_its_type(
    tmp_path: Path, req: GenerationRequest, end_id: int
) -> None:
    declared = {i.name: _type_name(i.data_type) for i in _production_config(tmp_path).input}
    sent = set(generate_body(req, end_id=end_id, pad_id=0, vocab_size=16)) - {"id"}
    assert sent <= set(BACKEND_INPUTS), sent - set(BACKEND_INPUTS)
    assert {name: declared.get(name) for name in sent} == {name: BACKEND_INPUTS[name] for name in sent}


def test_every_output_the_backend_writes_for_the_edge_is_declared(tmp_path: Path) -> None:
    assert generate_body(REQUESTS[0])["return_kv_cache_reuse_stats"] == [True]
    declared = {o.name: _type_name(o.data_type) for o in _production_config(tmp_path).output}
    written = ALWAYS_WRITTEN | STATS_WRITTEN
    assert {name: declared.get(name) for name in written} == written

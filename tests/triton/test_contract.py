"""The tensorrt_llm tensor contract: what the edge encodes is what the CPU model decodes, and the
metrics page reads the same from TensorRT-LLM and from our model."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from edge.upstreams.base import GenerationRequest, RequestRejected
from edge.upstreams.triton import _replica_urls, generate_body, stop_body, trtllm_capacity
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.cpu.tensors import (
    ContractError,
    decode_request,
    engine_config_from_parameters,
    stop_word_ids,
)
from gpu_container.triton.model_name import MODEL_NAME
from gpu_container.triton.trtllm_metrics import GENERATED_TOKENS_METRIC, parse_trtllm_metrics
from tests.edge.test_config import ENGINE_TABLE

_DTYPES = {"TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32, "TYPE_BOOL": np.bool_}


def _declared_inputs() -> dict[str, tuple[type[np.generic], list[int]]]:
    """The CPU model's input types and shapes, from the config.pbtxt Triton serves it with."""
    with tempfile.TemporaryDirectory() as repo:
        repository = render_cpu_repository(Path(repo), Path(repo) / "checkpoint", EngineConfig())
        text = (repository / MODEL_NAME / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return {
        i.name: (_DTYPES[model_config_pb2.DataType.Name(i.data_type)], list(i.dims)) for i in config.input
    }


def _as_model_sees_it(body: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """A generate request's JSON as Triton hands it to the model: every input the model declares,
    its values in the declared type and shape (a -1 takes what the values leave), with the batch
    dimension (one request) in front."""
    declared = _declared_inputs()
    assert set(body) - {"id"} <= set(declared), "an input the model does not declare"
    arrays = {}
    for name, value in body.items():
        if name != "id":
            dtype, dims = declared[name]
            arrays[name] = np.array(value, dtype=dtype).reshape([1, *dims])
    return arrays


def test_encoded_request_decodes_to_the_same_generation() -> None:
    req = GenerationRequest(
        "r1", [5, 6, 7], max_new_tokens=12, temperature=0.7, top_p=0.9, seed=2**40, stop_ids=[3, 9]
    )
    encoded = generate_body(req, end_id=2, pad_id=2)
    assert encoded["id"] == "r1"
    decoded = decode_request(_as_model_sees_it(encoded).get)
    assert decoded.prompt_ids == [5, 6, 7]
    assert decoded.streaming and not decoded.stop
    assert decoded.kv_cache_reuse_stats  # the KV cache stats with every response
    p = decoded.params
    assert p.max_new_tokens == 12
    assert p.temperature == pytest.approx(0.7)
    assert p.top_p == pytest.approx(0.9)
    assert p.seed == 2**40
    assert set(p.stop_token_ids) == {3, 9, 2}
    assert not p.ignore_eos


def test_greedy_travels_as_top_k_one_and_end_id_minus_one_ignores_eos() -> None:
    req = GenerationRequest("g", [1], max_new_tokens=4, temperature=0.0)
    arrays = _as_model_sees_it(generate_body(req, end_id=-1))
    assert arrays["runtime_top_k"].item() == 1
    assert arrays["temperature"].item() == 1.0  # TensorRT-LLM takes no temperature of 0
    decoded = decode_request(arrays.get)
    assert decoded.params.temperature == 0.0
    assert decoded.params.ignore_eos
    assert decoded.params.stop_token_ids == ()


@pytest.mark.parametrize("temperature", [1e-300, 1e-40])
def test_a_temperature_float32_cannot_hold_travels_as_greedy(temperature: float) -> None:
    """A temperature the schema takes (0 to 2) but FP32 cannot hold as a normal number is 0 or a
    denormal in the replica's tensor: a temperature of 0 TensorRT-LLM takes not, and one whose
    inverse is past float32's range. Greedy is what such a temperature means (the engine's float64
    division picks the greedy token too): it travels as greedy does, its penalties unscaled."""
    req = GenerationRequest("t", [1], max_new_tokens=4, temperature=temperature, presence_penalty=2.0)
    arrays = _as_model_sees_it(generate_body(req))
    assert arrays["runtime_top_k"].item() == 1
    assert arrays["temperature"].item() == 1.0
    assert arrays["presence_penalty"].item() == 2.0  # not 2 / 1e-300, held at float32's largest
    decoded = decode_request(arrays.get)
    assert decoded.params.temperature == 0.0
    assert decoded.params.presence_penalty == 2.0


def test_top_k_travels_as_runtime_top_k() -> None:
    req = GenerationRequest("k", [1], max_new_tokens=1, temperature=0.8, top_k=40)
    arrays = _as_model_sees_it(generate_body(req))
    assert arrays["runtime_top_k"].item() == 40
    assert decode_request(arrays.get).params.top_k == 40
    off = _as_model_sees_it(generate_body(GenerationRequest("o", [1], max_new_tokens=1)))
    assert off["runtime_top_k"].item() == 0 and decode_request(off.get).params.top_k == 0


def test_repetition_penalty_travels_only_when_set() -> None:
    req = GenerationRequest("r", [1], max_new_tokens=1, repetition_penalty=1.3)
    arrays = _as_model_sees_it(generate_body(req))
    assert decode_request(arrays.get).params.repetition_penalty == pytest.approx(1.3)
    plain = generate_body(GenerationRequest("p", [1], max_new_tokens=1))
    assert "repetition_penalty" not in plain


def test_min_tokens_travels_as_min_length_which_holds_back_the_end_id_alone() -> None:
    req = GenerationRequest("m", [1], max_new_tokens=9, min_tokens=6, stop_ids=[3, 9])
    arrays = _as_model_sees_it(generate_body(req, end_id=2))
    assert arrays["min_length"].item() == 6
    params = decode_request(arrays.get).params
    # TensorRT-LLM masks its end_id's logit until min_length; the stop words may end it sooner.
    assert (params.min_tokens, params.min_tokens_ids) == (6, (2,))
    assert set(params.stop_token_ids) == {2, 3, 9}
    # Not sent unset, nor with no end id to hold back (ignore_eos: end_id -1).
    assert "min_length" not in generate_body(GenerationRequest("p", [1], max_new_tokens=1), end_id=2)
    assert "min_length" not in generate_body(dataclasses.replace(req, ignore_eos=True), end_id=-1)


def test_a_negative_seed_wraps_into_uint64() -> None:
    req = GenerationRequest("s", [1], max_new_tokens=1, seed=-1)
    assert _as_model_sees_it(generate_body(req))["random_seed"].item() == 2**64 - 1


def test_logit_bias_travels_as_an_embedding_bias_row_of_the_vocabulary() -> None:
    bias = ((0, -100.0), (7, 2.5), (9, 100.0))
    req = GenerationRequest("b", [1], max_new_tokens=1, logit_bias=bias)
    arrays = _as_model_sees_it(generate_body(req, vocab_size=10))
    assert arrays["embedding_bias"].shape == (1, 10)  # [batch, vocab], as TensorRT-LLM takes it
    assert decode_request(arrays.get, vocab_size=10).params.logit_bias == bias
    with pytest.raises(ContractError, match="vocabulary"):  # a row for another model's vocabulary
        decode_request(arrays.get, vocab_size=11)
    # Without a logit_bias no row is sent: a model repository that does not declare it still works.
    assert "embedding_bias" not in generate_body(GenerationRequest("p", [1], max_new_tokens=1))
    # A row the edge cannot size, or an id outside it, is the request's refusal, never the replica's.
    with pytest.raises(RequestRejected, match="vocabulary"):
        generate_body(req)
    with pytest.raises(RequestRejected, match="outside"):
        generate_body(req, vocab_size=9)


def test_the_stop_request_carries_the_running_requests_id() -> None:
    decoded = decode_request(_as_model_sees_it(stop_body("to-stop")).get)
    assert decoded.stop


def test_input_lengths_trims_padding_and_missing_inputs_are_refused() -> None:
    arrays = {
        "input_ids": np.array([[4, 5, 6, 0, 0]], dtype=np.int32),
        "input_lengths": np.array([3], dtype=np.int32),
        "request_output_len": np.array([[8]], dtype=np.int32),
    }
    decoded = decode_request(arrays.get)
    assert decoded.prompt_ids == [4, 5, 6]
    assert decoded.params.temperature == 1.0 and not decoded.streaming
    with pytest.raises(ContractError):
        decode_request({"input_ids": arrays["input_ids"]}.get)


def test_stop_words_list_with_offsets() -> None:
    words = np.array([[[7, 8, 9, -1], [1, 2, 3, -1]]], dtype=np.int32)
    assert stop_word_ids(words) == (7, 8, 9)
    multi_token = np.array([[7, 8, 9], [2, 3, -1]], dtype=np.int32)
    with pytest.raises(ContractError, match="single-token"):
        stop_word_ids(multi_token)


def test_engine_config_from_model_parameters() -> None:
    cfg = engine_config_from_parameters({"num_blocks": "64", "block_size": "32", "model_dir": "/x"})
    assert cfg == EngineConfig(num_blocks=64, block_size=32)


@pytest.mark.parametrize("slowdown", ["inf", "Infinity"])
def test_an_infinite_prefill_slowdown_in_the_model_parameters_is_refused(slowdown: str) -> None:
    """The edge refuses an infinite setting at load (edge/config.py), but the CPU model reads its
    EngineConfig from config.pbtxt's strings, past that check: prefill_slowdown "inf" loaded, a
    time budget with no bound in time (tokens only, as 0 says), where the edge says it is wrong."""
    with pytest.raises(msgspec.ValidationError, match=r"prefill_slowdown \(inf\) must be a finite number"):
        engine_config_from_parameters({"prefill_slowdown": slowdown, "model_dir": "/x"})


def test_every_engine_setting_crosses_the_model_repository(tmp_path: Path) -> None:
    # The edge renders the CPU model's repository from its EngineConfig; the model reads its string
    # parameters back. Every field away from its default must come back as it went in.
    sent = EngineConfig(**ENGINE_TABLE)
    repository = render_cpu_repository(tmp_path, tmp_path / "checkpoint", sent)
    config_text = (repository / MODEL_NAME / "config.pbtxt").read_text()
    rendered = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    parameters = {key: value.string_value for key, value in rendered.parameters.items()}
    assert engine_config_from_parameters(parameters) == sent


# A TensorRT-LLM backend's page (older versions: no "waiting" gauge) beside another model.
TRTLLM_PAGE = """\
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 3
nv_inference_pending_request_count{model="other",version="1"} 50
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 10
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 14
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 100
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 6139
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6239
# HELP nv_trt_llm_general_metrics General TRT LLM metrics
# TYPE nv_trt_llm_general_metrics gauge
nv_trt_llm_general_metrics{general_type="iteration_counter",model="tensorrt_llm",version="1"} 4242
"""


def test_capacity_from_a_tensorrt_llm_metrics_page() -> None:
    metrics = parse_trtllm_metrics(TRTLLM_PAGE)
    assert metrics.iterations == 4242
    capacity = trtllm_capacity(metrics)
    assert capacity.kv_tokens_total == 6239 * 64
    assert capacity.kv_tokens_used == 100 * 64
    assert capacity.max_sequences == 64
    assert capacity.running == 10
    # 4 active but unscheduled in the backend, 3 still queued in Triton in front of it.
    assert capacity.waiting == 4 + 3
    # The dispatcher charges requests in this replica's whole blocks.
    assert capacity.kv_block_tokens == 64


def test_a_page_without_the_block_size_charges_single_tokens() -> None:
    assert trtllm_capacity(parse_trtllm_metrics("")).kv_block_tokens == 1


def test_generated_tokens_come_from_our_cpu_models_counter_only() -> None:
    assert parse_trtllm_metrics(TRTLLM_PAGE).generated_tokens == 0  # TensorRT-LLM has no such count
    counter = (
        f"# TYPE {GENERATED_TOKENS_METRIC} counter\n"
        f'{GENERATED_TOKENS_METRIC}{{model="tensorrt_llm",version="1"}} 1234\n'
        f'{GENERATED_TOKENS_METRIC}{{model="other",version="1"}} 99\n'
    )
    assert parse_trtllm_metrics(TRTLLM_PAGE + counter).generated_tokens == 1234


def test_replica_spec_parsing() -> None:
    assert _replica_urls("gpu-1:8000") == ("http://gpu-1:8000", "http://gpu-1:8002/metrics")
    assert _replica_urls(" 10.0.0.5:9000:9002 ") == ("http://10.0.0.5:9000", "http://10.0.0.5:9002/metrics")
    with pytest.raises(ValueError):
        _replica_urls("gpu-1")

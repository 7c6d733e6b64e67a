"""The production replicas run what the edge's defaults assume: the edge admits on real KV use, so
TensorRT-LLM runs the max_utilization capacity scheduler (its pausing of sequences is the safety
valve) with KV-cache reuse on (prefix-aware routing sends turns where their prefix is cached).

The repository is rendered the way the container's entrypoint renders it (no TRTLLM_* overrides)
and parsed as a Triton ModelConfig; every parameter it sets must be one TensorRT-LLM's Triton
backend reads (the keys of tensorrtllm_backend's all_models/inflight_batcher_llm/tensorrt_llm/
config.pbtxt), so a misspelt key, which the backend would silently ignore, fails here.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from edge.config import load_settings
from gpu_container.triton.entrypoint import settings_from_env
from gpu_container.triton.production.render import render_repository

BACKEND_PARAMETERS = {
    "FORCE_CPU_ONLY_INPUT_TENSORS",
    "batch_scheduler_policy",
    "cancellation_check_period_ms",
    "decoding_mode",
    "enable_chunked_context",
    "enable_kv_cache_reuse",
    "enable_trt_overlap",
    "exclude_input_in_output",
    "executor_worker_path",
    "gpt_model_path",
    "gpt_model_type",
    "gpu_device_ids",
    "iter_stats_max_iterations",
    "kv_cache_free_gpu_mem_fraction",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "max_attention_window_size",
    "max_beam_width",
    "max_tokens_in_paged_kv_cache",
    "normalize_log_probs",
    "request_stats_max_iterations",
}


def test_the_default_production_repository_matches_the_edges_default_admission(tmp_path: Path) -> None:
    assert load_settings().admission.kv_accounting == "real_use"

    model_dir = render_repository(tmp_path, settings_from_env({}, "/engines/model"))
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    params = {key: value.string_value for key, value in config.parameters.items()}

    assert config.backend == "tensorrtllm"
    assert set(params) <= BACKEND_PARAMETERS, set(params) - BACKEND_PARAMETERS
    assert params["batch_scheduler_policy"] == "max_utilization"
    assert params["enable_kv_cache_reuse"] == "true"
    # Reuse and chunked prefill both run on paged context attention (build_engine.py builds it).
    assert params["enable_chunked_context"] == "true"
    assert 0.0 < float(params["kv_cache_free_gpu_mem_fraction"]) <= 1.0

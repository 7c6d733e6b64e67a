"""Every config.pbtxt we ship parses as a Triton ModelConfig, so a typo fails here and not on a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from gpu_container.checkpoint.facts import read_facts
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.production.render import TrtLlmSettings, main, render_repository
from tests.support.live_server import demo_model_dir

CONTRACT_INPUTS = {
    "input_ids",
    "input_lengths",
    "request_output_len",
    "end_id",
    "pad_id",
    "streaming",
    "stop",
    "stop_words_list",
    "temperature",
    "runtime_top_k",
    "runtime_top_p",
    "random_seed",
    "return_kv_cache_reuse_stats",
}


def _parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _inputs(config: model_config_pb2.ModelConfig) -> dict[str, tuple[int, list[int]]]:
    return {i.name: (i.data_type, list(i.dims)) for i in config.input}


def test_production_repository_renders_a_valid_tensorrt_llm_config(tmp_path: Path) -> None:
    settings = TrtLlmSettings(
        engine_dir="/engines/llama",
        batch_scheduler_policy="max_utilization",
        kv_cache_free_gpu_mem_fraction=0.85,
        enable_kv_cache_reuse=False,
    )
    model_dir = render_repository(tmp_path, settings)
    assert (model_dir / "1").is_dir()
    config = _parse(model_dir / "config.pbtxt")
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert config.name == "tensorrt_llm"
    assert config.backend == "tensorrtllm"
    assert config.model_transaction_policy.decoupled
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == "/engines/llama"
    assert params["batch_scheduler_policy"] == "max_utilization"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.85"
    assert params["enable_kv_cache_reuse"] == "false"
    assert params["enable_chunked_context"] == "true"
    assert params["cancellation_check_period_ms"] == "10"
    assert CONTRACT_INPUTS <= set(_inputs(config))
    assert {"output_ids", "sequence_length"} <= {o.name for o in config.output}


def test_render_cli_writes_the_repository(tmp_path: Path) -> None:
    main(["--out", str(tmp_path), "--engine-dir", "/e", "--enable-chunked-context", "false"])
    params = _parse(tmp_path / "tensorrt_llm" / "config.pbtxt").parameters
    assert params["gpt_model_path"].string_value == "/e"
    assert params["enable_chunked_context"].string_value == "false"


def test_unknown_scheduler_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_scheduler_policy"):
        TrtLlmSettings(batch_scheduler_policy="fastest")  # type: ignore[arg-type]


def test_cpu_repository_speaks_the_same_tensor_contract(tmp_path: Path) -> None:
    production = _parse(render_repository(tmp_path / "prod", TrtLlmSettings()) / "config.pbtxt")
    cpu_dir = render_cpu_repository(tmp_path / "cpu", Path("/models/demo"), EngineConfig(num_blocks=64))
    cpu = _parse(cpu_dir / "tensorrt_llm" / "config.pbtxt")
    assert (cpu_dir / "tensorrt_llm" / "1" / "model.py").is_file()
    assert cpu.backend == "python"
    assert cpu.name == production.name
    assert cpu.max_batch_size == production.max_batch_size
    assert cpu.model_transaction_policy.decoupled
    prod_inputs = _inputs(production)
    for name, spec in _inputs(cpu).items():
        assert prod_inputs[name] == spec, name
    assert CONTRACT_INPUTS <= set(_inputs(cpu))
    prod_outputs = {o.name: (o.data_type, list(o.dims)) for o in production.output}
    for out in cpu.output:
        assert prod_outputs[out.name] == (out.data_type, list(out.dims))
    params = {k: v.string_value for k, v in cpu.parameters.items()}
    assert params["model_dir"] == "/models/demo"
    assert params["num_blocks"] == "64"


def test_production_repository_says_its_engines_sequence_limit(tmp_path: Path) -> None:
    """The engine's build_config.max_seq_len travels as the max_seq_len parameter the edge reads
    (gpu_container/triton/sequence_limit.py); an engine folder without config.json says none."""
    engine = tmp_path / "engine"
    engine.mkdir()
    bare = _parse(
        render_repository(tmp_path / "bare", TrtLlmSettings(engine_dir=str(engine))) / "config.pbtxt"
    )
    assert "max_seq_len" not in bare.parameters
    (engine / "config.json").write_text(json.dumps({"build_config": {"max_seq_len": 4096}}))
    built = _parse(
        render_repository(tmp_path / "built", TrtLlmSettings(engine_dir=str(engine))) / "config.pbtxt"
    )
    assert built.parameters["max_seq_len"].string_value == "4096"


def test_cpu_repository_says_its_engines_sequence_limit(tmp_path: Path) -> None:
    """The CPU engine's own: max_model_len within its KV pool and the checkpoint's positions."""
    model_dir = demo_model_dir()
    small_pool = EngineConfig(block_size=16, num_blocks=8, max_model_len=2048)
    cpu = _parse(
        render_cpu_repository(tmp_path / "pool", model_dir, small_pool) / "tensorrt_llm" / "config.pbtxt"
    )
    assert cpu.parameters["max_seq_len"].string_value == "128"
    long = EngineConfig(block_size=16, num_blocks=4096, max_model_len=1_000_000)
    cpu = _parse(render_cpu_repository(tmp_path / "long", model_dir, long) / "tensorrt_llm" / "config.pbtxt")
    assert cpu.parameters["max_seq_len"].string_value == str(read_facts(model_dir).max_context)

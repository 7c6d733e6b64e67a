"""The container entrypoint: settings from the environment, and the tritonserver command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_container.triton.entrypoint import settings_from_env, tritonserver_command


def test_environment_overrides_the_documented_defaults() -> None:
    settings = settings_from_env(
        {
            "TRTLLM_BATCH_SCHEDULER_POLICY": "max_utilization",
            "TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION": "0.8",
            "TRTLLM_ENABLE_KV_CACHE_REUSE": "false",
            "TRTLLM_MAX_BATCH_SIZE": "128",
            "TRTLLM_ENGINE_DIR": "/ignored",
            "UNRELATED": "x",
        },
        "/engines/model",
    )
    assert settings.engine_dir == "/engines/model"
    assert settings.batch_scheduler_policy == "max_utilization"
    assert settings.kv_cache_free_gpu_mem_fraction == 0.8
    assert settings.enable_kv_cache_reuse is False
    assert settings.max_batch_size == 128
    assert settings.enable_chunked_context is True


def test_a_bad_value_is_refused_before_the_server_starts() -> None:
    with pytest.raises(ValueError):
        settings_from_env({"TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION": "1.5"}, "/e")


def test_tritonserver_command_serves_the_rendered_repository() -> None:
    command = tritonserver_command(Path("/models"), ["--log-verbose=1"])
    assert command[0] == "tritonserver"
    assert "--model-repository=/models" in command
    assert "--grpc-port=8001" in command and "--metrics-port=8002" in command
    assert "--strict-readiness=true" in command
    assert command[-1] == "--log-verbose=1"

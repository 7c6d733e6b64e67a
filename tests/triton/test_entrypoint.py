"""The container entrypoint: settings from the environment, and the tritonserver command line."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_gpu_side_tracebacks_are_plain_and_carry_no_locals() -> None:
    # A separate interpreter: configuring structlog here would change every later test's logging.
    script = """
from gpu_container.plain_logging import configure_plain_logging
import structlog
configure_plain_logging()
def step():
    kv_cache = "KV-CACHE-CONTENTS-7f3a"
    raise RuntimeError("engine step failed")
try:
    step()
except RuntimeError:
    structlog.get_logger("t").exception("engine_crashed")
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=root
    )

    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["event"] == "engine_crashed" and record["level"] == "error"
    assert "Traceback (most recent call last)" in record["exception"]
    assert "RuntimeError: engine step failed" in record["exception"]
    assert "KV-CACHE-CONTENTS-7f3a" not in done.stdout + done.stderr


def test_an_engine_for_two_gpus_runs_two_ranks_under_mpirun(tmp_path: Path) -> None:
    from gpu_container.triton.entrypoint import engine_world_size

    (tmp_path / "config.json").write_text(
        json.dumps({"pretrained_config": {"mapping": {"world_size": 2, "tp_size": 2}}})
    )
    command = tritonserver_command(Path("/models"), ["--log-verbose=1"], engine_world_size(tmp_path))
    ranks = " ".join(command).split(" : ")

    assert command[:2] == ["mpirun", "--allow-run-as-root"]
    assert len(ranks) == 2
    assert all("-n 1 tritonserver --model-repository=/models" in r for r in ranks)
    assert "shm-region-prefix-name=prefix0_" in ranks[0] and "shm-region-prefix-name=prefix1_" in ranks[1]
    # Rank 0 serves (and takes the extra flags); rank 1 only loads the TensorRT-LLM model.
    assert "--log-verbose=1" in ranks[0] and "--log-verbose=1" not in ranks[1]
    assert "--model-control-mode=explicit --load-model=tensorrt_llm" in ranks[1]
    assert engine_world_size(tmp_path / "missing") == 1

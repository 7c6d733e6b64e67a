"""The engine build's command lines carry the flags in-flight batching needs."""

from __future__ import annotations

import itertools
from pathlib import Path

from gpu_container.triton.build_engine import (
    EngineBuild,
    convert_checkpoint_command,
    trtllm_build_command,
)


def _flags(command: list[str]) -> dict[str, str]:
    pairs = itertools.pairwise(command)
    return {flag: value for flag, value in pairs if flag.startswith("--")}


def test_convert_checkpoint_command_shards_for_tensor_parallelism() -> None:
    build = EngineBuild(hf_dir=Path("/ckpt/llama"), work_dir=Path("/build"), tp_size=2, dtype="bfloat16")
    command = convert_checkpoint_command(build)
    assert command[:2] == ["python3", "/opt/TensorRT-LLM/examples/llama/convert_checkpoint.py"]
    assert _flags(command) == {
        "--model_dir": "/ckpt/llama",
        "--output_dir": "/build/checkpoint",
        "--dtype": "bfloat16",
        "--tp_size": "2",
    }


def test_trtllm_build_command_enables_paged_kv_and_packed_inputs() -> None:
    build = EngineBuild(
        hf_dir=Path("/ckpt/llama"),
        work_dir=Path("/build"),
        max_batch_size=128,
        max_input_len=2048,
        max_seq_len=4096,
        max_num_tokens=16384,
    )
    command = trtllm_build_command(build)
    assert command[0] == "trtllm-build"
    flags = _flags(command)
    assert flags["--checkpoint_dir"] == "/build/checkpoint"
    assert flags["--output_dir"] == "/build/engine"
    assert flags["--kv_cache_type"] == "paged"
    assert flags["--gpt_attention_plugin"] == "auto"
    assert flags["--remove_input_padding"] == "enable"
    assert flags["--context_fmha"] == "enable"
    assert flags["--use_paged_context_fmha"] == "enable"
    assert flags["--max_batch_size"] == "128"
    assert flags["--max_input_len"] == "2048"
    assert flags["--max_seq_len"] == "4096"
    assert flags["--max_num_tokens"] == "16384"
    # Every flag takes exactly one value: a stray flag would shift the pairs above.
    assert len(command) == 1 + 2 * len(flags)

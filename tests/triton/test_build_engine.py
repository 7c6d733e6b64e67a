"""The engine build's command lines carry the flags in-flight batching needs."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
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
    # The image carries only TensorRT-LLM's wheel, not its examples/: the conversion is ours.
    assert command[:3] == ["python3", "-m", "gpu_container.triton.convert_checkpoint"]
    assert _flags(command) == {
        "--hf-dir": "/ckpt/llama",
        "--output-dir": "/build/checkpoint",
        "--dtype": "bfloat16",
        "--tp-size": "2",
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


# A stand-in for the TensorRT-LLM 0.16 wheel (no GPU here) with the API the real one has:
# tensorrt_llm.Mapping and tensorrt_llm.models.LLaMAForCausalLM, whose save_checkpoint writes what
# the real one does as far as the files go (rank<N>.safetensors; config.json with its mapping); each
# call recorded where STUB_CALLS names a file.
STUB = """
import json, os
from pathlib import Path


def _record(entry):
    if "STUB_CALLS" not in os.environ:
        return
    calls_file = Path(os.environ["STUB_CALLS"])
    calls = json.loads(calls_file.read_text()) if calls_file.exists() else []
    calls_file.write_text(json.dumps(calls + [entry]))


class Mapping:
    def __init__(self, world_size=1, rank=0, tp_size=1, pp_size=1, **_):
        self.__dict__.update(world_size=world_size, rank=rank, tp_size=tp_size, pp_size=pp_size)
"""

STUB_MODELS = """
import json, os

from tensorrt_llm import _record


class LLaMAForCausalLM:
    def __init__(self, mapping):
        self.mapping = mapping

    @classmethod
    def from_hugging_face(cls, model_dir, dtype, mapping=None, **_):
        _record({"call": "from_hugging_face", "model_dir": model_dir, "dtype": dtype, **mapping.__dict__})
        return cls(mapping)

    def save_checkpoint(self, output_dir, save_config=True):
        rank = self.mapping.rank
        _record({"call": "save_checkpoint", "output_dir": output_dir, "rank": rank,
                 "save_config": save_config})
        with open(os.path.join(output_dir, f"rank{rank}.safetensors"), "w") as f:
            f.write("weights")
        if save_config:
            with open(os.path.join(output_dir, "config.json"), "w") as f:
                json.dump({"mapping": {"world_size": self.mapping.world_size}}, f)
"""


def _stub_wheel(tmp_path: Path) -> Path:
    """The stand-in wheel, installed under `tmp_path`: the folder to put on PYTHONPATH."""
    stub = tmp_path / "stub" / "tensorrt_llm"
    (stub / "models").mkdir(parents=True)
    (stub / "__init__.py").write_text(STUB)
    (stub / "models" / "__init__.py").write_text(STUB_MODELS)
    return stub.parent


def test_the_conversion_uses_the_wheels_llama_api_rank_by_rank(tmp_path: Path) -> None:
    wheel = _stub_wheel(tmp_path)
    calls = tmp_path / "calls.json"
    root = Path(__file__).resolve().parents[2]
    command = convert_checkpoint_command(
        EngineBuild(hf_dir=Path("/ckpt/llama"), work_dir=tmp_path / "build", tp_size=2)
    )

    done = subprocess.run(
        [sys.executable, *command[1:]],
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{wheel}:{root}", "STUB_CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    out = str(tmp_path / "build" / "checkpoint")
    assert json.loads(calls.read_text()) == [
        {
            "call": "from_hugging_face",
            "model_dir": "/ckpt/llama",
            "dtype": "float16",
            "world_size": 2,
            "rank": 0,
            "tp_size": 2,
            "pp_size": 1,
        },
        {"call": "save_checkpoint", "output_dir": out, "rank": 0, "save_config": True},
        {
            "call": "from_hugging_face",
            "model_dir": "/ckpt/llama",
            "dtype": "float16",
            "world_size": 2,
            "rank": 1,
            "tp_size": 2,
            "pp_size": 1,
        },
        {"call": "save_checkpoint", "output_dir": out, "rank": 1, "save_config": False},
    ]


# What trtllm-build 0.16 does with a checkpoint folder, as far as the files go: one rank<N>.engine
# per rank of the checkpoint's mapping and config.json, into --output_dir, which it creates when
# missing and never empties.
TRTLLM_BUILD = """#!/usr/bin/env python3
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
checkpoint, out = args["--checkpoint_dir"], args["--output_dir"]
world_size = json.load(open(os.path.join(checkpoint, "config.json")))["mapping"]["world_size"]
os.makedirs(out, exist_ok=True)
for rank in range(world_size):
    with open(os.path.join(out, f"rank{rank}.engine"), "w") as f:
        f.write("engine")
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"pretrained_config": {"mapping": {"world_size": world_size}}}, f)
"""


def test_a_rebuild_in_the_same_work_dir_leaves_no_engine_of_the_last_build(tmp_path: Path) -> None:
    wheel = _stub_wheel(tmp_path)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "trtllm-build").write_text(TRTLLM_BUILD.replace("python3", sys.executable, 1))
    (fake_bin / "trtllm-build").chmod(0o755)
    # The conversion runs as `python3 -m ...`: the image's interpreter, this one here.
    (fake_bin / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (fake_bin / "python3").chmod(0o755)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PATH": f"{fake_bin}:{os.environ['PATH']}",
        "PYTHONPATH": f"{wheel}:{root}",
    }
    work = tmp_path / "build"

    def build(tp_size: int) -> None:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "gpu_container.triton.build_engine"),
                *("--hf-dir", str(tmp_path), "--work-dir", str(work), "--tp-size", str(tp_size)),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    build(4)
    build(2)  # the same model for 2 GPUs, in the folder the documented command names

    # What --upload sends and every GPU host downloads: the 2-GPU engine only. The 4-GPU build's
    # rank2 and rank3 were uploaded beside it before, half as much again to download and store.
    assert sorted(p.name for p in (work / "engine").iterdir()) == [
        "config.json",
        "rank0.engine",
        "rank1.engine",
    ]
    assert sorted(p.name for p in (work / "checkpoint").iterdir()) == [
        "config.json",
        "rank0.safetensors",
        "rank1.safetensors",
    ]

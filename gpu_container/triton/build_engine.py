"""Build a TensorRT-LLM engine from a Hugging Face Llama checkpoint (run on a GPU box, in the image).

    python3 -m gpu_container.triton.build_engine --hf-dir /ckpt/Llama-3-8B-Instruct \
        --work-dir /build --max-batch-size 64 --max-input-len 4096 --max-seq-len 8192 \
        [--tp-size 2] [--upload s3://bucket/engines/llama-3-8b/]

Two steps, as TensorRT-LLM documents them: the HF weights become a TensorRT-LLM checkpoint
(convert_checkpoint.py here, the wheel's LLaMAForCausalLM API, sharded for tensor parallelism),
then `trtllm-build` compiles it. The engine must be built on the GPU type and TensorRT-LLM version
it will serve on: build it with the same image as the Dockerfile (which pins the version), then
upload the engine folder with its SHA-256 manifest for fetch_engine.py. The flags are the ones
in-flight batching needs (see `trtllm_build_command`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

from gpu_container.contract import TRTLLM_DEFAULT_MAX_SEQ_LEN
from gpu_container.triton.fetch_engine import upload_engine

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class EngineBuild:
    hf_dir: Path
    work_dir: Path
    dtype: str = "float16"
    tp_size: int = 1
    max_batch_size: int = 64
    max_input_len: int = 4096
    max_seq_len: int = TRTLLM_DEFAULT_MAX_SEQ_LEN
    # Token budget of one in-flight batch (prefill chunks + decode tokens).
    max_num_tokens: int = 8192
    tokens_per_block: int = 64

    @property
    def checkpoint_dir(self) -> Path:
        return self.work_dir / "checkpoint"

    @property
    def engine_dir(self) -> Path:
        return self.work_dir / "engine"


def convert_checkpoint_command(build: EngineBuild) -> list[str]:
    return [
        "python3",
        "-m",
        "gpu_container.triton.convert_checkpoint",
        "--hf-dir",
        str(build.hf_dir),
        "--output-dir",
        str(build.checkpoint_dir),
        "--dtype",
        build.dtype,
        "--tp-size",
        str(build.tp_size),
    ]


def trtllm_build_command(build: EngineBuild) -> list[str]:
    return [
        "trtllm-build",
        "--checkpoint_dir",
        str(build.checkpoint_dir),
        "--output_dir",
        str(build.engine_dir),
        # In-flight batching needs the attention plugin over a paged KV cache and packed inputs.
        "--gpt_attention_plugin",
        "auto",
        "--gemm_plugin",
        "auto",
        "--kv_cache_type",
        "paged",
        "--tokens_per_block",
        str(build.tokens_per_block),
        "--remove_input_padding",
        "enable",
        "--context_fmha",
        "enable",
        # Paged context FMHA is what enable_chunked_context and enable_kv_cache_reuse run on.
        "--use_paged_context_fmha",
        "enable",
        "--max_batch_size",
        str(build.max_batch_size),
        "--max_input_len",
        str(build.max_input_len),
        "--max_seq_len",
        str(build.max_seq_len),
        "--max_num_tokens",
        str(build.max_num_tokens),
        "--max_beam_width",
        "1",
    ]


def build_engine(build: EngineBuild) -> Path:
    # Both steps write into their folder without emptying it (trtllm-build too): a rebuild in the
    # same --work-dir for fewer GPUs kept the last build's higher ranks, rank2.engine, rank3.engine,
    # beside the new engine, and --upload sent them with it to every GPU host, to download and
    # store (a 70B engine's worth more than the 200 GiB root volume holds).
    for folder in (build.checkpoint_dir, build.engine_dir):
        if folder.exists():
            log.info("removing the last build's output", folder=str(folder))
            shutil.rmtree(folder)
    for command in (convert_checkpoint_command(build), trtllm_build_command(build)):
        log.info("running", command=" ".join(command))
        subprocess.run(command, check=True)
    return build.engine_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a TensorRT-LLM engine from a HF Llama checkpoint.")
    parser.add_argument("--hf-dir", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-input-len", type=int, default=4096)
    parser.add_argument("--max-seq-len", type=int, default=TRTLLM_DEFAULT_MAX_SEQ_LEN)
    parser.add_argument("--max-num-tokens", type=int, default=8192)
    parser.add_argument("--upload", metavar="S3_URI", help="upload the engine folder here afterwards")
    args = parser.parse_args(argv)
    engine_dir = build_engine(
        EngineBuild(
            hf_dir=args.hf_dir,
            work_dir=args.work_dir,
            dtype=args.dtype,
            tp_size=args.tp_size,
            max_batch_size=args.max_batch_size,
            max_input_len=args.max_input_len,
            max_seq_len=args.max_seq_len,
            max_num_tokens=args.max_num_tokens,
        )
    )
    if args.upload:
        upload_engine(engine_dir, args.upload)


if __name__ == "__main__":
    main()

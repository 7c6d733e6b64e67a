"""Convert a Hugging Face Llama checkpoint to a TensorRT-LLM checkpoint, with the wheel's own API.

    python3 -m gpu_container.triton.convert_checkpoint --hf-dir /ckpt/Llama-3-8B-Instruct \
        --output-dir /build/checkpoint [--dtype float16] [--tp-size 2]

TensorRT-LLM's examples/llama/convert_checkpoint.py is not in the Triton image (only the wheel is),
but what it does for a plain (unquantised) Llama is the wheel's API: for every rank of the tensor-
parallel mapping, `LLaMAForCausalLM.from_hugging_face(model_dir, dtype, mapping=...)` then
`save_checkpoint(output_dir, save_config=(rank == 0))`, which writes config.json once and
rank<N>.safetensors per rank; `trtllm-build` compiles that folder. Run inside the image
(TensorRT-LLM 0.16 in tritonserver:24.12-trtllm-python-py3); imported lazily, so this module's
--help works anywhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def convert(hf_dir: Path, output_dir: Path, dtype: str, tp_size: int) -> None:
    """Write the TensorRT-LLM checkpoint of `hf_dir`, sharded over `tp_size` GPUs, to `output_dir`."""
    if tp_size < 1:
        raise ValueError("tp_size must be >= 1")
    # The wheel exists only in the GPU image.
    from tensorrt_llm import Mapping
    from tensorrt_llm.models import LLaMAForCausalLM

    output_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(tp_size):
        mapping = Mapping(world_size=tp_size, rank=rank, tp_size=tp_size, pp_size=1)
        log.info("converting rank", rank=rank, world_size=tp_size, hf_dir=str(hf_dir))
        model: Any = LLaMAForCausalLM.from_hugging_face(str(hf_dir), dtype, mapping=mapping)
        model.save_checkpoint(str(output_dir), save_config=(rank == 0))
        del model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert a HF Llama checkpoint to a TensorRT-LLM checkpoint."
    )
    parser.add_argument("--hf-dir", type=Path, required=True, help="Hugging Face checkpoint folder")
    parser.add_argument("--output-dir", type=Path, required=True, help="TensorRT-LLM checkpoint folder")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--tp-size", type=int, default=1, help="GPUs to shard the weights over")
    args = parser.parse_args(argv)
    convert(args.hf_dir, args.output_dir, args.dtype, args.tp_size)


if __name__ == "__main__":
    main()

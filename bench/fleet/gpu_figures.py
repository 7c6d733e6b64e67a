"""Published figures the simulated replicas are scaled to, each with its source. Nothing here is
measured by us: step_curve.py combines these with the curve shape measured on our engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThroughputRow:
    """NVIDIA's `trtllm-bench throughput` result: output tokens/s of one GPU, requests at an
    infinite rate, all requests of exactly `isl` input and `osl` output tokens."""

    isl: int
    osl: int
    output_tokens_per_s: float


# TensorRT-LLM "Performance Overview" (docs/source/performance/perf-overview.md, the v1.0 page,
# https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html), Llama 3.3 70B, FP8
# (nvidia/Llama-3.3-70B-Instruct-FP8), H200 SXM 141 GB, TP1.
LLAMA_70B_H200_TP1 = (
    ThroughputRow(1000, 1000, 2909.0),
    ThroughputRow(2048, 128, 442.0),
    ThroughputRow(5000, 500, 566.0),
    ThroughputRow(128, 2048, 4336.0),
    ThroughputRow(500, 2000, 3666.0),
)
PERF_OVERVIEW_URL = "https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html"

# NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 141 GB (https://www.nvidia.com/en-us/data-center/h200/).
H200_HBM_BYTES_PER_S = 4.8e12
H200_HBM_BYTES = 141e9
# Llama 3.3 70B in FP8: ~70.6e9 parameters, one byte each.
LLAMA_70B_FP8_WEIGHT_BYTES = 70.6e9
# KV cache per token in FP8: 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 1 byte (Llama 3 70B's
# config.json: num_hidden_layers 80, num_key_value_heads 8, head_dim 128).
LLAMA_70B_FP8_KV_BYTES_PER_TOKEN = 2 * 80 * 8 * 128
# Share of HBM TensorRT-LLM gives the KV cache after the weights (kv_cache_free_gpu_mem_fraction,
# NVIDIA's runs use 0.90-0.95; production/config.pbtxt.tmpl's default is 0.9).
KV_FREE_FRACTION = 0.9
# Fraction of the HBM roofline a batch-1 decode step reaches (weights streamed once per step);
# TensorRT-LLM's FP8 GEMV kernels reach ~70-80 % of peak bandwidth. An assumption, stated.
DECODE_BANDWIDTH_EFFICIENCY = 0.75

# What one host is: AWS p5en.48xlarge, 8 x H200 (each GPU its own TP1 engine).
GPUS_PER_HOST = 8
# $ per GPU-hour: EC2 Capacity Blocks for ML, p5en.48xlarge (8 x H200), US East (Ohio), effective
# accelerator hourly rate $5.408 (https://aws.amazon.com/ec2/capacityblocks/pricing/, rates in force
# in early 2025). On-demand is higher; a 1-3 year Savings Plan lower.
DOLLARS_PER_GPU_HOUR = 5.408
PRICE_URL = "https://aws.amazon.com/ec2/capacityblocks/pricing/"

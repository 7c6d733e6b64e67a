"""The name the model has inside Triton: TensorRT-LLM's own (its model repository's `tensorrt_llm`),
given by both repositories this project renders (production/render.py for TensorRT-LLM, cpu/
repository.py for the CPU engine), read in the metrics' labels (trtllm_metrics.py) and asked for by
the edge unless its settings name another (edge/upstreams/triton.py)."""

MODEL_NAME = "tensorrt_llm"

"""The production model repository: TensorRT-LLM behind Triton, rendered from one template."""

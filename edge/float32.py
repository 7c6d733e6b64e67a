"""Float32's smallest normal number: the least a sampling parameter may be where a replica holds it
in float32 (a Triton replica's FP32 tensors). Below it a value is denormal there, or 0: a top_p of
1e-300 reached TensorRT-LLM as 0, which it refuses. Its own module: the request's schema and the
settings both bound by it, and the settings are imported below the schema."""

FLOAT32_MIN_NORMAL = 1.1754943508222875e-38

"""Floodgate's continuous-batching CPU engine, shaped like nano-vllm.

engine.LLMEngine (step loop thread, thread-safe API) is the core; front.EngineFront makes it an
upstream replica of the seam's contract (gpu_container/contract.py), in a thread of this process
(async_engine.AsyncEngine) or in a child process (engine_process.EngineProcess). Underneath:
sequence (one request's state), block_manager + kv_cache (the paged KV pool), scheduler (continuous
batching, chunked prefill, priority, preemption), forward_batch (one step flattened), model (Llama
in numpy), sampler, loader (HF checkpoints), demo_model.
"""

"""Floodgate's continuous-batching CPU engine, shaped like nano-vllm.

engine.LLMEngine (step loop thread, thread-safe API) and async_engine.AsyncEngine (asyncio streams)
are the entry points. Underneath: sequence (one request's state), block_manager + kv_cache (the
paged KV pool), scheduler (continuous batching, chunked prefill, priority, preemption), forward_batch
(one step flattened), model (Llama in numpy), sampler, loader (HF checkpoints), demo_model.
"""

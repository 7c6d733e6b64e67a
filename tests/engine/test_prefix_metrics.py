"""Prefix-cache figures travel from the engine (or TensorRT-LLM's metrics page) to the edge's /metrics."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from edge.metrics import record_capacity
from edge.upstreams.base import Capacity
from edge.upstreams.triton import trtllm_capacity
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineConfig, SamplingParams
from gpu_container.triton.trtllm_metrics import parse_trtllm_metrics
from tests.engine.collector import TIMEOUT_S, Collector
from tests.engine.tiny_llama import tiny_model


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_local_replica_reports_its_cache_hits_and_blocks() -> None:
    config = EngineConfig(block_size=4, num_blocks=32, max_num_seqs=4, max_num_batched_tokens=32)
    engine = LLMEngine(tiny_model()[0], config, eos_token_ids=[1])
    engine.start()
    seen = Collector()
    params = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
    try:
        engine.add_request("first", list(range(2, 14)), params, seen)
        seen.wait_finished("first")
        engine.add_request("again", [*list(range(2, 14)), 40], params, seen)
        seen.wait_finished("again")
        assert engine.wait_until_idle(TIMEOUT_S)
        capacity = asyncio.run(AsyncEngine(engine, "local-x").capacity())
    finally:
        engine.stop()
    assert capacity.prefix_hit_tokens == 12 and capacity.prefix_query_tokens == 12 + 13
    # "first" kept its 12 prompt tokens + 2 computed outputs: three full blocks stay cached.
    assert capacity.kv_tokens_cached >= 12 and capacity.kv_tokens_used == 0

    record_capacity("", "local-x", capacity)
    assert _sample("floodgate_replica_prefix_cache_hit_tokens", model="", replica="local-x") == 12
    assert _sample("floodgate_replica_prefix_cache_hit_rate", model="", replica="local-x") == 12 / 25
    cached = _sample("floodgate_replica_kv_blocks", model="", replica="local-x", state="cached")
    free = _sample("floodgate_replica_kv_blocks", model="", replica="local-x", state="free")
    assert cached is not None and free is not None
    assert cached == capacity.kv_tokens_cached // 4 and cached + free == 32
    assert _sample("floodgate_replica_kv_blocks", model="", replica="local-x", state="used") == 0
    assert _sample("floodgate_replica_preemptions", model="", replica="local-x") == 0


def test_tensorrt_llm_reused_blocks_are_read_as_hit_tokens() -> None:
    family = "nv_trt_llm_kv_cache_block_metrics"
    values = {"tokens_per": 64, "max": 100, "used": 10, "reused": 7}
    page = f"# TYPE {family} gauge\n" + "".join(
        f'{family}{{kv_cache_block_type="{kind}",model="tensorrt_llm",version="1"}} {v}\n'
        for kind, v in values.items()
    )
    capacity = trtllm_capacity(parse_trtllm_metrics(page))
    assert capacity.prefix_hit_tokens == 7 * 64 and capacity.prefix_query_tokens == 0
    record_capacity("", "trt-x", capacity)
    assert _sample("floodgate_replica_prefix_cache_hit_tokens", model="", replica="trt-x") == 448
    # TensorRT-LLM does not say how many tokens it looked up: no rate rather than a wrong one.
    assert _sample("floodgate_replica_prefix_cache_hit_rate", model="", replica="trt-x") is None
    assert _sample("floodgate_replica_kv_blocks", model="", replica="trt-x", state="free") == 90


def test_capacity_without_prefix_figures_reads_zero() -> None:
    record_capacity(
        "", "plain", Capacity(kv_tokens_total=64, kv_tokens_used=16, max_sequences=4, running=1, waiting=0)
    )
    assert _sample("floodgate_replica_kv_blocks", model="", replica="plain", state="used") == 16
    assert _sample("floodgate_replica_kv_blocks", model="", replica="plain", state="cached") == 0

"""TensorRT-LLM's metrics on Triton's Prometheus page (port 8002): the names, and the one reader.

TensorRT-LLM's backend exports its state as gauges `nv_trt_llm_<kind>_metrics` with a label that
says which value a sample is (`request_type="active"`, `kv_cache_block_type="free"`, …). Three
parts read or write them: the edge (capacity of a Triton replica, edge/upstreams/triton.py), the
host agent (its drain waits for the active streams, host_agent.py) and our CPU model, which
exports the same gauges so the edge reads both alike (cpu/engine_model.py). They share the names
and the parser here.

Standard library only: the host agent runs in the Triton image, which has no prometheus_client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpu_container.triton.model_name import MODEL_NAME

REQUEST_FAMILY = "nv_trt_llm_request_metrics"
REQUEST_LABEL = "request_type"
KV_CACHE_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
KV_CACHE_LABEL = "kv_cache_block_type"
GENERAL_FAMILY = "nv_trt_llm_general_metrics"
GENERAL_LABEL = "general_type"
# Triton's own gauge of requests it holds before the backend took them.
PENDING_FAMILY = "nv_inference_pending_request_count"
# What our CPU model exports beside TensorRT-LLM's gauges: a counter TensorRT-LLM does not have.
GENERATED_TOKENS_METRIC = "floodgate_cpu_model_generated_tokens_total"
# And a gauge: requests whose final response has not gone out yet, those no client is left to read
# included (a stream cut short). A stop must wait for 0: the Python backend counts none of them as
# in flight, and an unload under a send crashes tritonserver (gpu_container/triton/README.md).
UNSENT_RESPONSES_METRIC = "floodgate_cpu_model_unsent_final_responses"

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Which label tells a family's samples apart (none: one sample per model).
_LABEL_OF = {
    KV_CACHE_FAMILY: KV_CACHE_LABEL,
    REQUEST_FAMILY: REQUEST_LABEL,
    GENERAL_FAMILY: GENERAL_LABEL,
    PENDING_FAMILY: "",
    GENERATED_TOKENS_METRIC: "",
    UNSENT_RESPONSES_METRIC: "",
}


def parse_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Every sample on a Prometheus text page: (name, labels, value); comments and lines that do
    not parse are skipped."""
    for line in text.splitlines():
        if line.startswith("#") or not (match := _SAMPLE.match(line)):
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        try:
            yield match.group("name"), labels, float(match.group("value"))
        except ValueError:
            continue


@dataclass(frozen=True, slots=True)
class TrtLlmMetrics:
    """The replica's gauges for one model, as TensorRT-LLM names them."""

    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int
    max_requests: int
    active_requests: int
    scheduled_requests: int
    waiting_requests: int
    pending_in_triton: int
    iterations: int
    # Our CPU model's own counter (GENERATED_TOKENS_METRIC); TensorRT-LLM's backend reads 0.
    generated_tokens: int
    # Blocks found in the KV-cache reuse cache (enable_kv_cache_reuse) since the replica started.
    reused_blocks: int = 0
    # Our CPU model's UNSENT_RESPONSES_METRIC; TensorRT-LLM's backend reads 0.
    unsent_final_responses: int = 0


def parse_trtllm_metrics(text: str, model: str = MODEL_NAME) -> TrtLlmMetrics:
    """Read the metrics page for `model`; a gauge the replica does not export reads as 0."""
    values = _values(parse_samples(text), model)

    def get(family: str, label: str = "") -> int:
        return int(values.get((family, label), 0.0))

    active, scheduled = get(REQUEST_FAMILY, "active"), get(REQUEST_FAMILY, "scheduled")
    # Older TensorRT-LLM backends have no "waiting" gauge: what is active but not scheduled waits.
    waiting = (
        get(REQUEST_FAMILY, "waiting")
        if (REQUEST_FAMILY, "waiting") in values
        else max(active - scheduled, 0)
    )
    return TrtLlmMetrics(
        max_blocks=get(KV_CACHE_FAMILY, "max"),
        free_blocks=get(KV_CACHE_FAMILY, "free"),
        used_blocks=get(KV_CACHE_FAMILY, "used"),
        tokens_per_block=get(KV_CACHE_FAMILY, "tokens_per"),
        max_requests=get(REQUEST_FAMILY, "max"),
        active_requests=active,
        scheduled_requests=scheduled,
        waiting_requests=waiting,
        pending_in_triton=get(PENDING_FAMILY),
        iterations=get(GENERAL_FAMILY, "iteration_counter"),
        generated_tokens=get(GENERATED_TOKENS_METRIC),
        reused_blocks=get(KV_CACHE_FAMILY, "reused"),
        unsent_final_responses=get(UNSENT_RESPONSES_METRIC),
    )


def active_requests(text: str) -> int:
    """TensorRT-LLM's active requests, summed over every model on the page."""
    return int(
        sum(
            value
            for name, labels, value in parse_samples(text)
            if name == REQUEST_FAMILY and labels.get(REQUEST_LABEL) == "active"
        )
    )


def _values(samples: Iterable[tuple[str, dict[str, str], float]], model: str) -> dict[tuple[str, str], float]:
    """(family, the label that tells its samples apart) -> value, summed over the model's samples."""
    values: dict[tuple[str, str], float] = {}
    for name, labels, value in samples:
        label = _LABEL_OF.get(name)
        if label is None or labels.get("model", model) != model:
            continue
        key = (name, labels.get(label, "") if label else "")
        values[key] = values.get(key, 0.0) + value
    return values

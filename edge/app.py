"""The Litestar app: routes, error handlers, and a lifespan that builds everything a request needs."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from litestar import Litestar
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware

from edge.admission.dispatcher import Dispatcher
from edge.admission.real_use import real_use
from edge.body_timeout import BodyReadTimeout
from edge.cancel.factory import open_request_registry
from edge.config import Settings
from edge.cors import allow_cross_origin
from edge.drain import Drain
from edge.errors import (
    STORE_ERRORS,
    ApiError,
    handle_api_error,
    handle_http_exception,
    handle_store_error,
    handle_unexpected,
)
from edge.keys.services import open_key_services
from edge.membership.edge_fleet import joined_fleet
from edge.messages.conversation_lock import ConversationLocks
from edge.messages.conversation_log import ConversationLog
from edge.messages.factory import create_store
from edge.messages.ids import MessageIdGenerator
from edge.messages.writer import MessageWriter
from edge.metric_series import create_known_series
from edge.model_source import resolve_model_dir
from edge.models.catalog import ModelCatalog
from edge.models.sampling import sampling_defaults
from edge.models.served import ServedModel, served_models
from edge.models.token_weight import weigh
from edge.open_files import connection_cap, raise_open_files_limit, stream_cap
from edge.openapi import openapi_config
from edge.pipeline import Pipeline, PipelineConfig
from edge.routes.admin import admin_routes
from edge.routes.cancel import cancel_completion
from edge.routes.chat import chat_completions
from edge.routes.chat_route import chat_route
from edge.routes.conversations import conversation_messages
from edge.routes.head import answer_head_with_get, path_allows
from edge.routes.health import healthz, readyz
from edge.routes.listeners import PATH_ALLOWS, PATH_LISTENERS, listener_split, path_listeners
from edge.routes.model_stats import model_stats
from edge.routes.models import list_models, retrieve_model
from edge.routes.observability import engine_state, prometheus_metrics
from edge.routes.playground import playground
from edge.routes.usage import own_usage
from edge.runtime import Runtime
from edge.scaling import ScalingPublisher, scaling_publisher, work_price
from edge.scaling.publisher import cloudwatch_client
from edge.stalled_readers import StalledReaders
from edge.stream_gate import StreamGate
from edge.text.model_text import ModelText
from edge.upstreams.base import Upstream
from edge.upstreams.local_pool import PrivateUpstreams, UpstreamProvider, local_upstreams
from edge.upstreams.replica_discovery import DiscoveredUpstreams
from gpu_container.checkpoint.facts import read_facts
from gpu_container.contract import TRTLLM_DEFAULT_MAX_SEQ_LEN
from limiter.factory import create_limiter
from limiter.redis_store import RedisLimiter


def _max_model_len(settings: Settings, model_dir: Path) -> int:
    """The longest sequence (prompt + completion) every replica of the model can hold, within the
    checkpoint's positions: the model's own `max_model_len` where set; and where the edge's settings
    build the replicas (CPU engines, a local Triton of them), within `[engine]` max_model_len and one
    engine's KV cache, which a sequence must fit alone. Triton replicas running elsewhere are
    TensorRT-LLM engines `[engine]` does not describe: their limit is their build's --max-seq-len,
    the model's `max_model_len` (build_engine.py's default when unset: past it TensorRT-LLM cuts a
    reply short as if it had ended). Taking `[engine]`'s for them cut every production model to the
    CPU engine's 2,048 tokens. A replica that says its own limit (a Triton repository's max_seq_len
    parameter: gpu_container/triton/sequence_limit.py) holds the model within it too, as requests
    come (Pipeline.max_model_len): the settings only guess an engine built elsewhere."""
    own = settings.model.max_model_len
    if settings.upstream.triton.strip() in ("", "local"):
        e = settings.engine
        limit = min(e.max_model_len, e.num_blocks * e.block_size, own or e.max_model_len)
    else:
        limit = own or TRTLLM_DEFAULT_MAX_SEQ_LEN
    return min(limit, read_facts(model_dir).max_context)


def _scaling_publisher(settings: Settings, dispatcher: Dispatcher) -> ScalingPublisher:
    """One served model's publisher: `settings` are the model's own, its prices in `metrics`."""
    m = settings.metrics
    region = m.cloudwatch_region or None
    return scaling_publisher(
        settings.model.name,
        dispatcher,
        lambda: cloudwatch_client(region),
        m.cloudwatch_interval_s,
        work_price(m),
    )


def replica_provider(settings: Settings, triton_model: str = "") -> UpstreamProvider:
    """`[upstream] triton` empty: the local CPU engines; otherwise Triton replicas (`local`,
    `HOST:PORT,...` or `asg:GROUP...`, see edge/upstreams/triton.py). The Triton client is imported
    only when asked for, so the default path never loads it."""
    spec = settings.upstream.triton.strip()
    if not spec:
        return local_upstreams
    triton = importlib.import_module("edge.upstreams.triton")
    provider: UpstreamProvider = triton.triton_upstreams(spec, triton_model or triton.MODEL_NAME)
    return provider


def _provider_of(
    model: ServedModel, upstreams: UpstreamProvider | Mapping[str, UpstreamProvider] | None
) -> UpstreamProvider:
    if upstreams is None:
        return replica_provider(model.settings, model.triton_model)
    if isinstance(upstreams, Mapping):
        return upstreams.get(model.name) or replica_provider(model.settings, model.triton_model)
    return upstreams


def create_app(
    settings: Settings,
    upstreams: UpstreamProvider | Mapping[str, UpstreamProvider] | None = None,
    message_ids: MessageIdGenerator | None = None,
) -> Litestar:
    """The app; `upstreams` replaces the replicas the settings name (tests, benchmarks): one
    provider for every model, or one per model name (the others keep their settings' replicas).
    `message_ids` makes the conversations' message ids (default: from this host's clock; a test's
    fleet gives each edge a clock of its own).

    `app.state.drain` is the app's drain (edge/drain.py): the server begins it on SIGTERM.
    `app.state.ops_port` is set by whoever binds the operator listener (edge/server.py).
    `app.state.max_connections`: the connections the open-file limit leaves room for
    (edge/open_files.py connection_cap), None for no cap."""
    models = served_models(settings)
    providers = {m.name: _provider_of(m, upstreams) for m in models}
    drain = Drain(settings.server.drain_accept_s, settings.server.drain_deadline_s)
    # A stream on a Triton replica holds a second socket (edge/open_files.py).
    fds_per_stream = 2 if any(m.settings.upstream.triton for m in models) else 1
    open_files = raise_open_files_limit()
    streams = stream_cap(settings.server.max_open_streams, fds_per_stream, open_files)
    gate = StreamGate(drain, streams, settings.admission.reserved_paid_fraction)
    stalled_readers = StalledReaders(settings.server.stalled_reader_s)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            # First in, last out: usage rows of every request that ends are written before exit.
            keys = await stack.enter_async_context(open_key_services(settings))
            lim = settings.limiter
            limiter = create_limiter(
                lim.backend,
                lim.redis_url,
                lim.timeout_ms,
                lim.instance_count,
                cluster=lim.redis_cluster,
                lease_ttl_s=lim.slot_ttl_s,
            )
            stack.push_async_callback(limiter.aclose)
            if isinstance(limiter, RedisLimiter):
                await limiter.connect()  # its connections before the first request, not during it
            store = await create_store(settings.messages)
            stack.push_async_callback(store.aclose)
            writer = MessageWriter(store, settings.messages.queue_size)
            writer.start()
            stack.push_async_callback(writer.aclose)
            locks = ConversationLocks(store)
            locks.start()
            stack.push_async_callback(locks.aclose)
            registry = await stack.enter_async_context(open_request_registry(settings.limiter))
            pipelines: dict[str, Pipeline] = {}
            ids = message_ids or MessageIdGenerator()  # one per edge, all its models' turns alike
            all_replicas: list[Upstream] = []
            dispatchers: list[Dispatcher] = []
            # Those whose replicas every edge instance reaches: the fleet divides these replicas.
            shared: list[Dispatcher] = []
            for model in models:
                # Each model: its own replicas, dispatcher (queue, router, capacity) and pipeline;
                # the limiter, registry and writers are shared.
                own = model.settings
                model_dir = resolve_model_dir(own.model)
                text = ModelText.load(model_dir)
                replicas = await stack.enter_async_context(providers[model.name](own, model_dir))
                all_replicas.extend(replicas)
                # Every instance counts only its own requests: each fills its share of a replica all
                # of them reach, and the whole of one only it reaches (its own engines).
                private = isinstance(replicas, PrivateUpstreams)
                dispatcher = Dispatcher(
                    replicas,
                    reserved_paid_fraction=settings.admission.reserved_paid_fraction,
                    max_queue=settings.admission.max_queue,
                    replica_share=1.0 if private else 1 / lim.instance_count,
                    # Only the redis backend's fleet (below) changes the share: with the in-memory
                    # limiter a request past it is refused for good, a 400, not a 503 forever.
                    share_fixed=lim.backend == "memory",
                    prefix_weight=settings.admission.prefix_weight,
                    real_use=real_use(settings.admission),
                    model=model.name if settings.models else "",
                )
                await dispatcher.start()
                stack.push_async_callback(dispatcher.aclose)
                # At 0 from the start, not from each one's first increment (edge/metric_series.py).
                create_known_series(dispatcher.model, settings.tiers)
                dispatchers.append(dispatcher)
                if not private:
                    shared.append(dispatcher)
                if isinstance(replicas, DiscoveredUpstreams):
                    # Replicas found later join the dispatcher (and leave it) while the app runs.
                    await stack.enter_async_context(replicas.watch(dispatcher))
                if settings.metrics.cloudwatch:
                    publisher = _scaling_publisher(own, dispatcher)
                    publisher.start()
                    stack.push_async_callback(publisher.aclose)
                sampling = sampling_defaults(own.model, model_dir)
                config = PipelineConfig(
                    model_name=model.name,
                    max_model_len=_max_model_len(own, model_dir),
                    keepalive_s=settings.server.keepalive_s,
                    tiers=settings.tiers,
                    token_weight=own.model.token_weight,
                    default_temperature=sampling.temperature,
                    default_top_p=sampling.top_p,
                    default_top_k=sampling.top_k,
                    default_repetition_penalty=sampling.repetition_penalty,
                    prefix_cache_scope=settings.admission.prefix_cache_scope,
                    limits_divisor=lim.instance_count if lim.backend == "memory" else 1,
                )
                charged = weigh(limiter, own.model.token_weight)
                log = ConversationLog(writer, ids)
                pipelines[model.name] = Pipeline(
                    config,
                    text,
                    charged,
                    dispatcher,
                    registry,
                    log,
                    drain=drain,
                    usage=keys.usage_writer,
                    key_watch=keys.streams,
                    gate=gate,
                    locks=locks,
                )
            app.state.fleet = None
            app.state.fleet_divides = bool(shared)  # read by /readyz: a joiner waits for room
            if lim.backend == "redis":
                # The live edge count sets the replica share of every dispatcher on shared replicas
                # and the fallback divisor; the departed edges, whose users' concurrency slots the
                # limiter frees; and this edge's own slots put back when it returns from being
                # counted out.
                redis_limiter = limiter if isinstance(limiter, RedisLimiter) else None
                divide = redis_limiter.set_instance_count if redis_limiter else None
                free = redis_limiter.free_slots_of if redis_limiter else None
                restore = redis_limiter.restore_slots if redis_limiter else None
                fleet = joined_fleet(lim, settings.fleet, shared, drain, divide, free, restore)
                app.state.fleet = await stack.enter_async_context(fleet)
            catalog = ModelCatalog(pipelines, settings.tiers, several=bool(settings.models))
            app.state.runtime = Runtime(
                settings=settings,
                keys=keys.authenticator,
                pipeline=catalog.default,
                registry=registry,
                upstreams=all_replicas,
                messages=store,
                message_writer=writer,
                key_admin=keys.lifecycle,
                usage=keys.usage_store,
                usage_writer=keys.usage_writer,
                models=catalog,
                history_reads=limiter,
            )
            try:
                yield
            finally:
                del app.state.runtime
                drain.close()
                await stalled_readers.aclose()

    app = Litestar(
        route_handlers=[
            chat_completions,
            cancel_completion,
            conversation_messages,
            own_usage,
            # Off, the admin API does not exist: any method on its paths is an unknown path's 404.
            *([admin_routes()] if settings.keys.admin_key_hashes else []),
            list_models,
            retrieve_model,
            model_stats,
            healthz,
            readyz,
            prometheus_metrics,
            engine_state,
            playground,
        ],
        lifespan=[lifespan],
        middleware=[
            listener_split,  # outermost: a route the listener does not serve never reaches the gate
            gate.middleware,
            DefineMiddleware(BodyReadTimeout, timeout_s=settings.server.body_timeout_s),
            chat_route,  # innermost: the chat route's lean path
        ],
        exception_handlers={
            ApiError: handle_api_error,
            HTTPException: handle_http_exception,
            **dict.fromkeys(STORE_ERRORS, handle_store_error),
            Exception: handle_unexpected,
        },
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=openapi_config(),
        # The logging is edge/logging_setup.py's, one JSON object per line: Litestar's default
        # config replaced the root logger's handler with its own plain-text one, and uvicorn's,
        # Litestar's and botocore's lines went out unstructured, on stderr.
        logging_config=None,
    )
    answer_head_with_get(app)
    # Outermost, around Litestar's exception handling: a browser must be able to read a refusal too.
    app.asgi_handler = allow_cross_origin(app.asgi_handler, settings.server.cors_allow_origins)
    app.state.drain = drain
    # Read by edge/server.py's uvicorn_config: the public listener's connection cap.
    app.state.max_connections = connection_cap(open_files, streams, fds_per_stream)
    app.state[PATH_LISTENERS] = path_listeners(app)  # read by edge/routes/listeners.py
    app.state[PATH_ALLOWS] = path_allows(app)  # read by edge/routes/listeners.py
    app.state.stalled_readers = stalled_readers  # read by edge/streaming.py
    return app

"""A Triton replica as an upstream: TensorRT-LLM's `tensorrt_llm` contract over gRPC streaming.

One bidirectional `ModelStreamInfer` stream per request. Closing the generator early (or
cancelling the task that reads it) cancels the stream and sends the contract's `stop` request for
the request id on a stream of its own: the model drops the sequence on its next step, where a
cancelled stream alone is only noticed by the model's poll (`cancellation_check_period_ms`); once
the upstream is closed (shutdown) no stop is sent, so nothing reopens the channel. A
request the replica refuses for its own parameters is a RequestRejected (a 400 for that request;
the replica stays healthy), any other error an UpstreamError: gpu_container/triton/refusals.py
tells them apart. The request asks for an empty final response, so the end of a generation is a
flag on the wire, never a guess. The channel uses tritonclient's generated stub directly because
tritonclient.grpc.aio's stream_infer cannot set that flag.

Prompt tokens served from the replica's prefix cache (Delta.cached_tokens) come from TensorRT-LLM's
per-request `kv_cache_reused_blocks` output, which the request asks for with `return_perf_metrics`
and the replica sends with every response; blocks become tokens at the replica's own block size,
its `tokens_per` KV gauge. A replica that does not say its block size reports 0, with a warning.

The request's cache_salt is not sent, so a Triton replica shares its prefix cache across users
whatever `[admission] prefix_cache_scope` says: TensorRT-LLM's executor keys blocks by a per-request
`cache_salt_id` (its LLM API's `cache_salt`), but the Triton backend's `tensorrt_llm` model declares
no input for it (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt), and our
CPU model follows that contract.

Capacity comes from the replica's Prometheus metrics (the nv_trt_llm_* gauges TensorRT-LLM
exports, which our CPU model mirrors, plus Triton's pending-request count), cached briefly. Our CPU
model also counts the tokens it generated, which tests read as the replica's own record of work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import numpy as np
import numpy.typing as npt
import structlog
from tritonclient.grpc import service_pb2, service_pb2_grpc

from edge.config import Settings
from edge.upstreams.asg_resolver import is_asg_spec
from edge.upstreams.base import (
    Capacity,
    Delta,
    FinishReason,
    GenerationRequest,
    RequestRejected,
    Upstream,
    UpstreamError,
)
from edge.upstreams.local_pool import UpstreamProvider
from edge.upstreams.triton_fleet import discovered_triton_upstreams
from gpu_container.checkpoint.facts import read_facts
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import start_local_triton
from gpu_container.triton.refusals import refusal_reason
from gpu_container.triton.trtllm_metrics import MODEL_NAME, TrtLlmMetrics, parse_trtllm_metrics

log = structlog.get_logger(__name__)

TRITON_METRICS_PORT = 8002
_FINAL = "triton_final_response"
_ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
_REUSED_BLOCKS = "kv_cache_reused_blocks"


def trtllm_capacity(metrics: TrtLlmMetrics) -> Capacity:
    """The replica's capacity in the edge's terms, from its TensorRT-LLM gauges."""
    return Capacity(
        kv_tokens_total=metrics.max_blocks * metrics.tokens_per_block,
        kv_tokens_used=metrics.used_blocks * metrics.tokens_per_block,
        max_sequences=metrics.max_requests,
        running=metrics.scheduled_requests,
        waiting=metrics.waiting_requests + metrics.pending_in_triton,
        # A replica that does not export the gauge reads 0: charge in single tokens then.
        kv_block_tokens=max(metrics.tokens_per_block, 1),
        prefix_hit_tokens=metrics.reused_blocks * metrics.tokens_per_block,
    )


def _tensor(request: Any, name: str, datatype: str, array: npt.NDArray[Any]) -> None:
    request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
    request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())


def encode_request(
    req: GenerationRequest, model: str, *, end_id: int | None = None, pad_id: int | None = None
) -> Any:
    """A ModelInferRequest in the `tensorrt_llm` contract (batch of one, streaming)."""
    request = service_pb2.ModelInferRequest(model_name=model, id=req.request_id)
    request.parameters[_ENABLE_EMPTY_FINAL].bool_param = True

    def scalar(name: str, datatype: str, value: object, dtype: type[np.generic]) -> None:
        _tensor(request, name, datatype, np.array([[value]], dtype=dtype))

    _tensor(request, "input_ids", "INT32", np.array([req.prompt_ids], dtype=np.int32))
    scalar("input_lengths", "INT32", len(req.prompt_ids), np.int32)
    scalar("request_output_len", "INT32", req.max_new_tokens, np.int32)
    scalar("streaming", "BOOL", True, np.bool_)
    # Per-request perf metrics, among them kv_cache_reused_blocks (the prefix-cache hit).
    scalar("return_perf_metrics", "BOOL", True, np.bool_)
    # TensorRT-LLM decodes greedily with top_k = 1; a temperature of 0 is not a value it takes.
    greedy = req.temperature == 0
    scalar("runtime_top_k", "INT32", 1 if greedy else 0, np.int32)
    scalar("temperature", "FP32", 1.0 if greedy else req.temperature, np.float32)
    scalar("runtime_top_p", "FP32", req.top_p, np.float32)
    if req.seed is not None:
        # The seed travels as UINT64: a negative one wraps rather than failing the request.
        scalar("random_seed", "UINT64", req.seed % 2**64, np.uint64)
    if end_id is not None:
        scalar("end_id", "INT32", end_id, np.int32)
    if pad_id is not None:
        scalar("pad_id", "INT32", pad_id, np.int32)
    if req.stop_ids:
        # [ids; end offsets]: every stop word here is one token long.
        words = [req.stop_ids, list(range(1, len(req.stop_ids) + 1))]
        _tensor(request, "stop_words_list", "INT32", np.array([words], dtype=np.int32))
    return request


def encode_stop(request_id: str, model: str) -> Any:
    """The `stop` request for `request_id` (TensorRT-LLM's way to end a running request at once),
    with the inputs the contract requires of every request."""
    request = encode_request(GenerationRequest(request_id, [0], max_new_tokens=1), model)
    _tensor(request, "stop", "BOOL", np.array([[True]], dtype=np.bool_))
    return request


def decode_tokens(response: Any) -> list[int]:
    """New token ids of one streamed response (beam 0); empty for the bare final response."""
    names = [out.name for out in response.outputs]
    if "output_ids" not in names:
        return []
    ids = np.frombuffer(response.raw_output_contents[names.index("output_ids")], dtype=np.int32)
    if "sequence_length" in names:
        raw_length = response.raw_output_contents[names.index("sequence_length")]
        length = int(np.frombuffer(raw_length, dtype=np.int32)[0])
        if 0 <= length <= ids.size:
            ids = ids[:length]
    return [int(t) for t in ids]


def decode_reused_blocks(response: Any) -> int | None:
    """The request's prefix-cache hit in KV blocks, when the response carries it."""
    names = [out.name for out in response.outputs]
    if _REUSED_BLOCKS not in names:
        return None
    raw = np.frombuffer(response.raw_output_contents[names.index(_REUSED_BLOCKS)], dtype=np.int32)
    return int(raw[0]) if raw.size else None


class TritonUpstream:
    def __init__(
        self,
        name: str,
        grpc_url: str,
        metrics_url: str,
        *,
        model_name: str = MODEL_NAME,
        end_id: int | None = None,
        pad_id: int | None = None,
        extra_stop_ids: tuple[int, ...] = (),
        first_response_timeout_s: float = 30.0,
        stall_timeout_s: float = 60.0,
        capacity_ttl_s: float = 0.25,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self.name = name
        self.grpc_url = grpc_url
        self.metrics_url = metrics_url
        self.model_name = model_name
        self._end_id = end_id
        self._pad_id = pad_id
        # More end tokens than TensorRT-LLM's single end_id (e.g. Llama 3's <|eot_id|>).
        self._extra_stop_ids = extra_stop_ids
        # A replica that goes silent mid-stream is as failed as one that never answers.
        self._first_timeout_s = first_response_timeout_s
        self._stall_timeout_s = stall_timeout_s
        self._capacity_ttl_s = capacity_ttl_s
        self._probe_timeout_s = probe_timeout_s
        # Created on first use, inside the event loop that will drive them.
        self._channel: grpc.aio.Channel | None = None
        self._stub_instance: Any = None
        self._http: httpx.AsyncClient | None = None
        self._metrics_cache: tuple[float, TrtLlmMetrics] | None = None
        # The replica's KV block size (its tokens_per gauge), once its metrics have said it.
        self._block_tokens = 0
        self._stops: set[asyncio.Task[None]] = set()
        # Set by aclose: a stream closed after it sends no `stop` (that would open a new channel
        # nobody closes); the model's poll of closed streams drops its request instead.
        self._closed = False

    def _stub(self) -> Any:
        if self._stub_instance is None:
            self._channel = grpc.aio.insecure_channel(
                self.grpc_url,
                options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
            )
            self._stub_instance = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub_instance

    async def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        # TensorRT-LLM's end_id -1: no end token (the contract's ignore_eos); stop_ids still end it.
        end_id = -1 if req.ignore_eos else self._end_id
        if self._extra_stop_ids and not req.ignore_eos:
            stops = [*req.stop_ids, *(t for t in self._extra_stop_ids if t not in req.stop_ids)]
            req = dataclasses.replace(req, stop_ids=stops)
        request = encode_request(req, self.model_name, end_id=end_id, pad_id=self._pad_id)

        async def requests() -> AsyncIterator[Any]:
            yield request

        call = self._stub().ModelStreamInfer(requests())
        stop_tokens = set(req.stop_ids) | ({end_id} if end_id is not None else set())
        generated = 0
        last_token: int | None = None
        finished = replica_ended = False
        try:
            timeout_s = self._first_timeout_s
            read: Callable[[], Awaitable[Any]] = functools.partial(_first_read, call)
            while not finished:
                try:
                    async with asyncio.timeout(timeout_s):
                        message = await read()
                except TimeoutError:
                    raise UpstreamError(f"{self.name}: no response within {timeout_s:.0f} s") from None
                except grpc.aio.AioRpcError as exc:
                    replica_ended = True
                    raise _stream_error(self.name, exc.details() or "", exc.code()) from exc
                # Set up now: a cancel lands on grpc's receive, which re-raises it unchanged.
                timeout_s, read = self._stall_timeout_s, call.read
                if message is grpc.aio.EOF:
                    replica_ended = True
                    raise UpstreamError(f"{self.name}: stream ended without a final response")
                if message.error_message:
                    replica_ended = True
                    raise _stream_error(self.name, message.error_message)
                response = message.infer_response
                tokens = decode_tokens(response)
                # Reported on the delta carrying the first token, as the in-process engine does.
                cached = await self._cached_tokens(response) if tokens and not generated else 0
                generated += len(tokens)
                if tokens:
                    last_token = tokens[-1]
                finished = response.parameters[_FINAL].bool_param if _FINAL in response.parameters else False
                if finished:
                    yield Delta(
                        tokens,
                        _finish_reason(last_token, stop_tokens, generated, req.max_new_tokens),
                        cached,
                    )
                elif tokens:
                    yield Delta(tokens, cached_tokens=cached)
        finally:
            if not finished:
                call.cancel()
                if not replica_ended:
                    self._stop_soon(req.request_id)

    async def _cached_tokens(self, response: Any) -> int:
        """Prompt tokens the replica found in its prefix cache: reused blocks x its block size."""
        reused = decode_reused_blocks(response)
        if not reused:
            return 0
        if not self._block_tokens:
            try:
                await self._metrics()
            except UpstreamError as exc:
                log.warning("triton_block_size_unknown", replica=self.name, error=str(exc))
        if not self._block_tokens:
            # Never a guessed block size: the figure is left out rather than made up.
            log.warning("triton_cached_tokens_unreported", replica=self.name, reused_blocks=reused)
            return 0
        return reused * self._block_tokens

    def _stop_soon(self, request_id: str) -> None:
        """Send the `stop` request for `request_id` from a task of its own: a generator that is
        being closed or cancelled cannot wait for the reply."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop left (interpreter shutdown): the model's poll still drops the request
        task = loop.create_task(self._stop(request_id), name=f"triton-stop-{request_id}")
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, request_id: str) -> None:
        request = encode_stop(request_id, self.model_name)

        async def one() -> AsyncIterator[Any]:
            yield request

        call = self._stub().ModelStreamInfer(one())
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                reply = await call.read()
            if reply is grpc.aio.EOF or reply.error_message:
                raise UpstreamError(reply.error_message if reply is not grpc.aio.EOF else "no reply")
        except (TimeoutError, grpc.aio.AioRpcError, UpstreamError) as exc:
            # Not fatal: the model's poll of closed streams drops the request a little later.
            log.info("triton_stop_failed", replica=self.name, request_id=request_id, error=repr(exc))
        finally:
            call.cancel()

    async def _metrics(self) -> TrtLlmMetrics:
        now = time.monotonic()
        if self._metrics_cache is not None and now - self._metrics_cache[0] < self._capacity_ttl_s:
            return self._metrics_cache[1]
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._probe_timeout_s)
        try:
            page = await self._http.get(self.metrics_url)
            page.raise_for_status()
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{self.name}: metrics unavailable: {exc}") from exc
        metrics = parse_trtllm_metrics(page.text, self.model_name)
        self._metrics_cache = (time.monotonic(), metrics)
        self._block_tokens = metrics.tokens_per_block
        return metrics

    async def metrics(self) -> TrtLlmMetrics:
        """The replica's nv_trt_llm_* gauges, fresh (not cached)."""
        self._metrics_cache = None
        return await self._metrics()

    async def capacity(self) -> Capacity:
        return trtllm_capacity(await self._metrics())

    async def ready(self) -> bool:
        stub = self._stub()
        try:
            server = await stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=self._probe_timeout_s)
            model = await stub.ModelReady(
                service_pb2.ModelReadyRequest(name=self.model_name), timeout=self._probe_timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(server.ready and model.ready)

    async def aclose(self) -> None:
        self._closed = True
        # Stops still in flight are bounded by the probe timeout; closing the channel ends them.
        if self._stops:
            await asyncio.wait(list(self._stops), timeout=self._probe_timeout_s)
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub_instance = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


async def _first_read(call: Any) -> Any:
    """The stream's first response, read in a task of its own that a cancel cannot reach.

    Until the first response, `call.read()` awaits grpc.aio's own stream set-up task, so a cancel
    landing then would cancel that task instead: it swallows the cancellation and ends without
    anyio's message, and a bare CancelledError escapes the caller's cancel scope. Shielded, the
    cancel lands on this await alone and propagates as the caller's own; the caller then cancels
    the call (which ends the set-up and tells Triton to drop the request).
    """
    read = asyncio.ensure_future(call.read())
    try:
        return await asyncio.shield(read)
    except asyncio.CancelledError:
        # Not left running: its outcome is retrieved by shield, nobody else reads it.
        read.cancel()
        raise


def _stream_error(
    name: str, message: str, code: grpc.StatusCode | None = None
) -> RequestRejected | UpstreamError:
    """A refusal of the request's own parameters, or the replica's failure."""
    reason = refusal_reason(message, invalid_argument=code == grpc.StatusCode.INVALID_ARGUMENT)
    if reason is not None:
        return RequestRejected(reason)
    return UpstreamError(f"{name}: {code.name}: {message}" if code is not None else f"{name}: {message}")


def _finish_reason(last: int | None, stop_tokens: set[int], generated: int, limit: int) -> FinishReason:
    if last is not None and last in stop_tokens:
        return "stop"
    if generated >= limit:
        return "length"
    # TensorRT-LLM leaves the end token out of its output: ending early means it saw one.
    return "stop"


def _replica_urls(spec: str) -> tuple[str, str]:
    """`host:grpc_port[:metrics_port]` -> (grpc target, metrics URL); metrics default to 8002."""
    parts = spec.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"expected HOST:GRPC_PORT[:METRICS_PORT], got {spec!r}")
    host, grpc_port = parts[0], int(parts[1])
    metrics_port = int(parts[2]) if len(parts) == 3 else TRITON_METRICS_PORT
    return f"{host}:{grpc_port}", f"http://{host}:{metrics_port}/metrics"


def remote_triton_upstream(
    spec: str,
    *,
    end_id: int | None = None,
    pad_id: int | None = None,
    extra_stop_ids: tuple[int, ...] = (),
    model_name: str = MODEL_NAME,
) -> TritonUpstream:
    """A running replica at `HOST:GRPC_PORT[:METRICS_PORT]`, named `triton-HOST:GRPC_PORT` (with
    `/MODEL` when it serves a Triton model other than tensorrt_llm: one server, several models)."""
    grpc_url, metrics_url = _replica_urls(spec)
    suffix = "" if model_name == MODEL_NAME else f"/{model_name}"
    return TritonUpstream(
        f"triton-{grpc_url}{suffix}",
        grpc_url,
        metrics_url,
        model_name=model_name,
        end_id=end_id,
        pad_id=pad_id,
        extra_stop_ids=extra_stop_ids,
    )


async def build_triton_upstreams(
    spec: str,
    model_dir: Path,
    engine_cfg: EngineConfig,
    *,
    end_id: int | None = None,
    pad_id: int | None = None,
    extra_stop_ids: tuple[int, ...] = (),
    model_name: str = MODEL_NAME,
) -> tuple[list[Upstream], Callable[[], Awaitable[None]]]:
    """Upstreams for `--triton local` (start tritonserver here over the CPU repository serving
    `model_dir`) or `--triton HOST:PORT[:METRICS_PORT],...` (running replicas).

    Returns the upstreams and an async cleanup that closes them and stops a local server.
    """
    if spec.strip() == "local":
        repo_dir = Path(tempfile.mkdtemp(prefix="floodgate-cpu-repo-"))
        render_cpu_repository(repo_dir, model_dir, engine_cfg, model_name=model_name)
        server = await anyio.to_thread.run_sync(start_local_triton, repo_dir)
        suffix = "" if model_name == MODEL_NAME else f"/{model_name}"
        local = TritonUpstream(
            f"triton-local{suffix}",
            server.grpc_url,
            server.metrics_url,
            model_name=model_name,
            end_id=end_id,
            pad_id=pad_id,
        )

        async def stop_local() -> None:
            # Shielded: a server shutting down cancels its lifespan, and tritonserver must not outlive it.
            with anyio.CancelScope(shield=True):
                await local.aclose()
                await anyio.to_thread.run_sync(server.stop)
                shutil.rmtree(repo_dir, ignore_errors=True)

        return [local], stop_local

    upstreams: list[Upstream] = [
        remote_triton_upstream(
            item, end_id=end_id, pad_id=pad_id, extra_stop_ids=extra_stop_ids, model_name=model_name
        )
        for item in filter(None, (s.strip() for s in spec.split(",")))
    ]
    if not upstreams:
        raise ValueError("--triton needs `local` or at least one HOST:PORT")

    async def close_all() -> None:
        for upstream in upstreams:
            await upstream.aclose()

    return upstreams, close_all


def end_token_ids(model_dir: Path) -> list[int]:
    """The checkpoint's end tokens, by the one rule of gpu_container/checkpoint/facts.py."""
    return list(read_facts(model_dir).eos_token_ids)


def triton_upstreams(spec: str, model_name: str = MODEL_NAME) -> UpstreamProvider:
    """The app's replica provider for `floodgate serve --triton SPEC` (see build_triton_upstreams);
    `asg:GROUP[:GRPC_PORT[:METRICS_PORT]]` finds them in an Auto Scaling group (triton_fleet.py).
    `model_name`: the Triton model the replicas serve ([models.NAME] triton_model)."""

    @asynccontextmanager
    async def provide(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
        eos = end_token_ids(model_dir)
        tokens: dict[str, Any] = {
            "end_id": eos[0] if eos else None,
            "pad_id": eos[0] if eos else None,
            "extra_stop_ids": tuple(eos[1:]),
            "model_name": model_name,
        }
        if is_asg_spec(spec):
            make = functools.partial(remote_triton_upstream, **tokens)
            async with discovered_triton_upstreams(spec, settings, make) as discovered:
                yield discovered
            return
        engine_cfg = settings.engine.engine_config()
        upstreams, cleanup = await build_triton_upstreams(spec, model_dir, engine_cfg, **tokens)
        try:
            yield upstreams
        finally:
            with anyio.CancelScope(shield=True):
                await cleanup()

    return provide

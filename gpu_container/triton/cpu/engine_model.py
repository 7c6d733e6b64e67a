"""Our continuous-batching engine as a Triton Python-backend model, behind the `tensorrt_llm` contract.

Runs inside the backend stub (model.py, next to this file, hands over to EngineModel), where
triton_python_backend_utils is importable.

One engine per model instance; every request joins its batch. `execute` only decodes a request and
hands it to the engine; the engine thread posts each step's tokens to an outbox, and a sender
thread sends them through each request's response sender (decoupled: many responses, the last one
flagged FINAL), first tokens first (outbox.py). A `stop=true` request with the same request id
(what the edge sends when it leaves a stream early) aborts the request in the engine, which frees
its KV blocks on the next step. A watcher thread polls `is_cancelled()` of the live requests (a
closed gRPC stream) every `cancellation_check_period_ms` for streams closed without one; each probe
is an IPC round trip per request. The engine's stats are exported as the gauges TensorRT-LLM's
backend exports (nv_trt_llm_*), so the edge reads capacity the same way from both, plus a
generated-tokens counter of our own. A request that sets `return_kv_cache_reuse_stats` gets its
prefix-cache hit as TensorRT-LLM 0.16's three KV cache outputs (kv_cache_reused_blocks among them)
with every response, as TensorRT-LLM sends them.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog
import triton_python_backend_utils as pb_utils  # only inside tritonserver's Python backend

from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.types import EngineStats, TokenOutput
from gpu_container.plain_logging import configure_plain_logging
from gpu_container.triton.cpu.dlpack_capsule import mark_consumed
from gpu_container.triton.cpu.outbox import Outbox
from gpu_container.triton.cpu.tensors import (
    KvCacheReuseStats,
    decode_request,
    engine_config_from_parameters,
    output_arrays,
)
from gpu_container.triton.refusals import REFUSED
from gpu_container.triton.trtllm_metrics import (
    GENERAL_FAMILY,
    GENERAL_LABEL,
    GENERATED_TOKENS_METRIC,
    KV_CACHE_FAMILY,
    KV_CACHE_LABEL,
    REQUEST_FAMILY,
    REQUEST_LABEL,
    UNSENT_RESPONSES_METRIC,
)

log = structlog.get_logger("floodgate.triton.cpu_model")

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
THREAD_JOIN_TIMEOUT_S = 5.0
# TensorRT-LLM 0.16's words (inflight_batcher_llm/src/utils.cc) for a streaming request to a model
# whose config is not decoupled.
STREAMING_NEEDS_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."


@dataclass
class _Live:
    request: Any
    sender: Any
    triton_id: str
    streaming: bool
    # Asked for the KV cache stats (`return_kv_cache_reuse_stats`): sent with every response.
    kv_cache_reuse_stats: bool
    # Blocks the prompt fills: kv_cache_alloc_total_blocks.
    prompt_blocks: int
    # Non-streaming requests get every token in their one final response.
    tokens: list[int] = field(default_factory=list)
    abort_requested: bool = False
    # Held across this request's cancellation probe (an IPC round trip), and taken to mark it final:
    # probing a request whose final response has gone out crashes tritonserver (its response
    # factory is freed). Per request, so a probe never holds up the other requests' work.
    probe: threading.Lock = field(default_factory=threading.Lock)
    final_sent: bool = False
    # Prompt tokens found in the prefix cache, from the engine's output carrying the first token.
    cached_tokens: int = 0


class _Metrics:
    """EngineStats as TensorRT-LLM's nv_trt_llm_* gauges (same names and label values), plus a
    counter of generated tokens that TensorRT-LLM does not export (GENERATED_TOKENS_METRIC)."""

    def __init__(self, model: str, version: str) -> None:
        labels = {"model": model, "version": version}
        gauge = pb_utils.MetricFamily.GAUGE
        self._families = {
            "request": pb_utils.MetricFamily(
                name=REQUEST_FAMILY, description="TRT LLM request metrics", kind=gauge
            ),
            "kv": pb_utils.MetricFamily(
                name=KV_CACHE_FAMILY,
                description="TRT LLM KV cache block metrics",
                kind=gauge,
            ),
            "general": pb_utils.MetricFamily(
                name=GENERAL_FAMILY, description="General TRT LLM metrics", kind=gauge
            ),
            "tokens": pb_utils.MetricFamily(
                name=GENERATED_TOKENS_METRIC,
                description="Tokens the CPU engine has generated",
                kind=pb_utils.MetricFamily.COUNTER,
            ),
            "unsent": pb_utils.MetricFamily(
                name=UNSENT_RESPONSES_METRIC,
                description="Requests whose final response has not gone out yet",
                kind=gauge,
            ),
        }
        request, kv, general = self._families["request"], self._families["kv"], self._families["general"]
        self._gauges = {
            "active": request.Metric(labels={REQUEST_LABEL: "active", **labels}),
            "max": request.Metric(labels={REQUEST_LABEL: "max", **labels}),
            "scheduled": request.Metric(labels={REQUEST_LABEL: "scheduled", **labels}),
            "waiting": request.Metric(labels={REQUEST_LABEL: "waiting", **labels}),
            "blocks_max": kv.Metric(labels={KV_CACHE_LABEL: "max", **labels}),
            "blocks_free": kv.Metric(labels={KV_CACHE_LABEL: "free", **labels}),
            "blocks_used": kv.Metric(labels={KV_CACHE_LABEL: "used", **labels}),
            "tokens_per": kv.Metric(labels={KV_CACHE_LABEL: "tokens_per", **labels}),
            # Prefix-cache hits in blocks, as TensorRT-LLM reports enable_kv_cache_reuse's.
            "blocks_reused": kv.Metric(labels={KV_CACHE_LABEL: "reused", **labels}),
            "iterations": general.Metric(labels={GENERAL_LABEL: "iteration_counter", **labels}),
            "unsent": self._families["unsent"].Metric(labels=labels),
        }
        self._generated_tokens = self._families["tokens"].Metric(labels=labels)
        self._last: dict[str, int] = {}
        self._last_generated = 0

    def update(self, stats: EngineStats, live: int, unsent: int) -> None:
        """`live`: requests admitted and not yet final; `unsent`: those whose final response has
        not gone out yet. Not thread-safe: the caller serialises (EngineModel._publish_metrics)."""
        # The counter first: each write below is a separate IPC call, and a scrape may land between
        # any two. A reader that waits on the gauges (idle, iterations advanced) must find the tokens
        # of the same snapshot already counted; written last, the counter lagged the gauges by the
        # final step's tokens (20 x 32 streams read as 620: one short per stream).
        if stats.generated_tokens > self._last_generated:
            self._generated_tokens.increment(stats.generated_tokens - self._last_generated)
            self._last_generated = stats.generated_tokens
        values = {
            # From its admission (the engine counts it from its next step).
            "active": max(stats.running + stats.waiting, live),
            "max": stats.max_num_seqs,
            "scheduled": stats.running,
            "waiting": stats.waiting,
            "blocks_max": stats.num_blocks,
            "blocks_free": stats.free_blocks,
            "blocks_used": stats.num_blocks - stats.free_blocks,
            "tokens_per": stats.block_size,
            "blocks_reused": stats.prefix_hit_tokens // stats.block_size,
            "iterations": stats.steps,
            "unsent": unsent,
        }
        for key, value in values.items():
            # Each set() is an IPC round trip to the server: skip the ones that did not move.
            if self._last.get(key) != value:
                self._gauges[key].set(value)
                self._last[key] = value

    def close(self) -> None:
        # The backend requires every Metric to go before its MetricFamily.
        self._gauges.clear()
        del self._generated_tokens
        self._families.clear()


# The wheel's backend stub is built against numpy 2's ABI: under numpy 1.x, Tensor(name, array) and
# as_numpy() silently read the wrong bytes. DLPack crosses that boundary correctly for both.
def _response(token_ids: list[int], stats: KvCacheReuseStats | None) -> Any:
    arrays = output_arrays(token_ids, stats)
    return pb_utils.InferenceResponse(output_tensors=[_tensor(name, array) for name, array in arrays.items()])


def _tensor(name: str, array: np.ndarray[Any, Any]) -> Any:
    # Handed over as a capsule of our own, marked consumed once the stub took it (dlpack_capsule.py).
    capsule = array.__dlpack__()
    tensor = pb_utils.Tensor.from_dlpack(name, capsule)
    mark_consumed(capsule)
    return tensor


def _send_error(sender: Any, message: str, code: int) -> None:
    """The request's one final response, an error with Triton's status `code`."""
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)


class EngineModel:
    def __init__(self, args: dict[str, str]) -> None:
        configure_plain_logging()
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        engine_config = engine_config_from_parameters(parameters)
        self._engine = LLMEngine.from_pretrained(parameters["model_dir"], engine_config)
        self._block_size = engine_config.block_size
        self._cancel_period_s = int(parameters.get("cancellation_check_period_ms", "100")) / 1000
        # TensorRT-LLM's backend refuses a streaming request to a model not deployed decoupled (its
        # utils.cc, INTERNAL): a stock config filled in with decoupled_mode:False does that to every
        # request of the edge's. Refused here alike, so the edge's reading of it is tested.
        self._decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self._metrics_period_s = int(parameters.get("metrics_period_ms", "20")) / 1000
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        # Admitted requests whose final response has not gone out (under _lock): outlasts _live by
        # the final send.
        self._unsent = 0
        self._by_triton_id: dict[str, str] = {}
        self._metrics = _Metrics(args["model_name"], args["model_version"])
        # The watcher refreshes periodically; the requests going from none to one and back again
        # refresh at once (_publish_metrics).
        self._publishing = threading.Lock()
        self._metrics_closed = False
        self._metrics.update(self._engine.stats(), live=0, unsent=0)
        self._stopping = threading.Event()
        self._outbox = Outbox()
        self._engine.start()
        self._sender = threading.Thread(target=self._send_loop, name="response-sender", daemon=True)
        self._sender.start()
        self._watcher = threading.Thread(target=self._watch, name="cancel-watcher", daemon=True)
        self._watcher.start()
        log.info("cpu engine model ready", model_dir=parameters["model_dir"])

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._admit(request, sender)
            except ValueError as exc:
                # The contract's and the engine's refusals of the request's own parameters: INVALID_ARG,
                # so the edge answers 400 and keeps the replica (gpu_container/triton/refusals.py).
                log.info("request refused", error=str(exc))
                _send_error(sender, f"{REFUSED}{exc}", pb_utils.TritonError.INVALID_ARG)
            except Exception as exc:
                # Anything else (the engine stopped) is this replica's failure.
                log.warning("request failed", error=str(exc))
                _send_error(sender, str(exc), pb_utils.TritonError.INTERNAL)

    def _admit(self, request: Any, sender: Any) -> None:
        # One pass: pb_utils.get_input_tensor_by_name rebuilds the list of every input per lookup.
        inputs = {tensor.name(): tensor for tensor in request.inputs()}

        def get(name: str) -> Any:
            tensor = inputs.get(name)
            return None if tensor is None else np.from_dlpack(tensor)

        contract = decode_request(get, self._engine.vocab_size)
        triton_id = request.request_id()
        if contract.stop:
            with self._lock:
                target = self._by_triton_id.get(triton_id)
            if target is not None:
                self._engine.abort(target)
            sender.send(flags=FINAL)
            return
        if contract.streaming and not self._decoupled:
            raise RuntimeError(STREAMING_NEEDS_DECOUPLED)
        prompt_blocks = -(-len(contract.prompt_ids) // self._block_size)
        live = _Live(
            request, sender, triton_id, contract.streaming, contract.kv_cache_reuse_stats, prompt_blocks
        )
        with self._lock:
            # Triton ids are the client's choice: only a fresh one can also name the engine request.
            unique = bool(triton_id) and triton_id not in self._by_triton_id
            engine_id = triton_id if unique else f"{triton_id}#{uuid.uuid4().hex}"
            self._live[engine_id] = live
            self._unsent += 1
            # The first live request, whatever finals are still to go out: the page last said no
            # request was live (published as the last one went), and kept saying so, under load,
            # while a request admitted before the previous one's final send was out ran and held
            # tokens (the unsent count was what this once went by).
            first = len(self._live) == 1
            if unique:
                self._by_triton_id[triton_id] = engine_id
        try:
            if first:
                # Busy on the page before the first token can reach anyone: a reader who waits for
                # the page to go idle after holding a token then knows its request has been
                # answered in full (a request shorter than the watcher's period never showed).
                self._publish_metrics()
            self._engine.add_request(engine_id, contract.prompt_ids, contract.params, self._outbox.post)
        except Exception:
            # execute() sends the error as its final response.
            self._forget(engine_id)
            self._final_sent()
            raise

    def _forget(self, engine_id: str) -> _Live | None:
        with self._lock:
            live = self._live.pop(engine_id, None)
            if live is not None and self._by_triton_id.get(live.triton_id) == engine_id:
                del self._by_triton_id[live.triton_id]
            return live

    def _send_loop(self) -> None:
        # Sending waits on the backend's IPC; doing it here keeps the engine thread stepping.
        while (batch := self._outbox.take()) is not None:
            for out in batch:
                for first in self._outbox.take_first():
                    self._deliver(first)
                self._deliver(out)

    def _deliver(self, out: TokenOutput) -> None:
        """Sender thread: the new tokens of one request since its last response."""
        if out.finish_reason is None:
            if (live := self._live.get(out.request_id)) is not None:
                self._send(live, out)
            return
        if (live := self._forget(out.request_id)) is None:
            return
        # Waits for a probe of this request in flight; none starts after (see _abort_cancelled).
        with live.probe:
            live.final_sent = True
        if not self._live:
            # Going idle: a reader who has this last final response must find its tokens counted
            # and the page idle (a request shorter than the watcher's period never showed on the
            # page otherwise, and the next reader's "idle before" snapshot missed its tokens).
            # Only then, so it costs nothing under load.
            self._publish_metrics()
        try:
            self._send(live, out)
        finally:
            self._final_sent()

    def _final_sent(self) -> None:
        with self._lock:
            self._unsent -= 1
            none_left = self._unsent == 0
        if none_left:
            # Every final response is out, those no client reads included (a stream cut short):
            # a stop may come now (TritonUpstream.wait_idle).
            self._publish_metrics()

    def _publish_metrics(self) -> None:
        # Read and written under one lock, so the last write holds the latest count: a stale "idle"
        # must never land after a new request's "active".
        with self._publishing:
            if self._metrics_closed:
                return
            try:
                self._metrics.update(self._engine.stats(), live=len(self._live), unsent=self._unsent)
            except Exception as exc:
                # Called from the sender thread between a request's forget and its final send (and
                # after it): a metrics write that fails must not end that thread, skip the send, or
                # leave the unsent count stuck. The next publish writes what this one missed.
                log.warning("metrics publish failed", error=str(exc))

    def _send(self, live: _Live, out: TokenOutput) -> None:
        live.cached_tokens += out.cached_tokens
        # Whole blocks by construction: the engine caches and finds full blocks only.
        stats = (
            KvCacheReuseStats(live.cached_tokens // self._block_size, live.prompt_blocks)
            if live.kv_cache_reuse_stats
            else None
        )
        try:
            if out.error is not None:
                _send_error(live.sender, out.error, pb_utils.TritonError.INTERNAL)
            elif live.streaming:
                flags = FINAL if out.finish_reason is not None else 0
                if out.token_ids:
                    live.sender.send(_response(out.token_ids, stats), flags=flags)
                elif flags:
                    live.sender.send(flags=FINAL)
            else:
                live.tokens.extend(out.token_ids)
                if out.finish_reason is not None:
                    live.sender.send(_response(live.tokens, stats), flags=FINAL)
        except Exception as exc:
            # The client is gone mid-send: stop generating for it.
            log.warning("response send failed, aborting", error=str(exc))
            self._engine.abort(out.request_id)

    def _watch(self) -> None:
        next_probe = next_metrics = 0.0
        while not self._stopping.wait(min(self._cancel_period_s, self._metrics_period_s)):
            now = time.monotonic()
            if now >= next_probe:
                self._abort_cancelled()
                next_probe = now + self._cancel_period_s
            if now >= next_metrics:
                self._publish_metrics()
                next_metrics = now + self._metrics_period_s

    def _abort_cancelled(self) -> None:
        """Abort the live requests whose client has gone (a closed gRPC stream).

        A method of its own so that no request outlives it in a local variable: while the stub
        holds a request object, Triton holds its model, and a model held at shutdown never unloads.
        """
        with self._lock:
            candidates = [(rid, live) for rid, live in self._live.items() if not live.abort_requested]
        for engine_id, live in candidates:
            with live.probe:
                if live.final_sent:
                    continue
                cancelled = live.request.is_cancelled()
            if cancelled:
                live.abort_requested = True
                self._engine.abort(engine_id)

    def finalize(self) -> None:
        """Cancel what is still running, send every final response, then let the threads go.

        Each wait is bounded: a thread stuck in a call into the server must not hold up its shutdown
        (the threads are daemons, so the stub exits without them).
        """
        self._stopping.set()
        _join(self._watcher)
        # Every live request gets its final "cancelled" response through the outbox.
        self._engine.stop()
        self._outbox.close()
        _join(self._sender)
        with self._lock:
            unanswered = len(self._live)
        if unanswered:
            log.warning("requests left without a final response", requests=unanswered)
        with self._publishing:
            # A sender thread that outlived its join must not publish into closed metrics.
            self._metrics_closed = True
            self._metrics.close()


def _join(thread: threading.Thread) -> None:
    thread.join(THREAD_JOIN_TIMEOUT_S)
    if thread.is_alive():
        log.warning("thread did not stop in time", thread=thread.name, timeout_s=THREAD_JOIN_TIMEOUT_S)

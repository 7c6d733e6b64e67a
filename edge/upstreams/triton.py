"""A Triton replica as an upstream: TensorRT-LLM's `tensorrt_llm` contract over Triton's HTTP
`generate_stream` (server-sent events), read by edge/upstreams/triton_sse.py.

One keep-alive HTTP/1.1 connection per open stream, taken from the replica's pool. Closing the
generator early (or cancelling the task that reads it) drops the connection and sends the contract's
`stop` request for the request id on a connection of its own: the model drops the sequence on its
next step, where a dropped connection alone is only noticed when Triton next writes to it, or by the
model's poll (`cancellation_check_period_ms`); once the upstream is closed (shutdown) no stop is
sent. A stream left before any answer keeps its connection until the request answers or ends: its
stop may have overtaken it on the way into the model, and is sent again once it answers.

A request the replica refuses for its own parameters is a RequestRejected (a 400 for that
request; the replica stays healthy), any other error an UpstreamError, a 400 from Triton's own input
checks included (a replica whose model differs from the contract the edge sends):
gpu_container/triton/refusals.py tells them apart. The end of the HTTP response is the end of the
generation (Triton ends it on the response flagged final), never a guess.

A request answered that the model's Python-backend stub is dead ends the replica's other open
streams at once (Triton sends them nothing more) and keeps the replica not ready until Triton's
request counts say the model serves again, which its readiness does not (edge/upstreams/triton_stub.py).

Prompt tokens served from the replica's prefix cache (Delta.cached_tokens) come from TensorRT-LLM's
per-request `kv_cache_reused_blocks` output, which the request asks for with
`return_kv_cache_reuse_stats` (the name the pinned TensorRT-LLM 0.16 backend reads; from 0.19 on it
is `return_perf_metrics`) and the replica sends with every response; blocks become tokens at the
replica's own block size, its `tokens_per` KV gauge. A replica that does not say its block size
reports 0, with a warning.

The request's cache_salt is not sent, so a Triton replica shares its prefix cache across users
whatever `[admission] prefix_cache_scope` says: TensorRT-LLM's executor keys blocks by a per-request
`cache_salt_id` (its LLM API's `cache_salt`), but the Triton backend's `tensorrt_llm` model declares
no input for it (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt), and our
CPU model follows that contract. A salted request (scope "user") is therefore reported 0 cached
tokens: the blocks it reused may be another user's, and the figure told every user whether another
had sent a prompt, a prefix guessed block by block (a review). Unsalted ("shared"), it is reported.

Capacity comes from the replica's Prometheus metrics (the nv_trt_llm_* gauges TensorRT-LLM
exports, which our CPU model mirrors, plus Triton's pending-request count), cached briefly. Our CPU
model also counts the tokens it generated, which tests read as the replica's own record of work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import msgspec
import structlog

from edge.config import Settings
from edge.float32 import FLOAT32_MIN_NORMAL
from edge.upstreams.asg_resolver import is_asg_spec
from edge.upstreams.base import (
    Capacity,
    ContextLengthExceeded,
    Delta,
    FinishReason,
    GenerationRequest,
    RequestRejected,
    Upstream,
    UpstreamError,
)
from edge.upstreams.direct import DeltaSink
from edge.upstreams.local_pool import PrivateUpstreams, UpstreamProvider
from edge.upstreams.replica_spec import parse_replica_address
from edge.upstreams.triton_fleet import discovered_triton_upstreams
from edge.upstreams.triton_sse import ConnectionPool, SseConnection
from edge.upstreams.triton_stub import (
    RequestCounts,
    StubQuarantine,
    is_stub_dead,
    parse_request_counts,
)
from gpu_container.checkpoint.facts import read_facts
from gpu_container.engine.types import EngineConfig
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import EXIT_TIMEOUT_S, start_local_triton
from gpu_container.triton.model_name import MODEL_NAME
from gpu_container.triton.refusals import exceeds_context, refusal_reason
from gpu_container.triton.sequence_limit import reported_max_seq_len
from gpu_container.triton.trtllm_metrics import TrtLlmMetrics, parse_trtllm_metrics

log = structlog.get_logger(__name__)

# How often wait_idle reads the metrics page.
IDLE_POLL_S = 0.02
_encode_json = msgspec.json.Encoder().encode


def trtllm_capacity(metrics: TrtLlmMetrics, max_sequence_tokens: int = 0) -> Capacity:
    """The replica's capacity in the edge's terms, from its TensorRT-LLM gauges and the sequence
    limit its model config says (0: unknown)."""
    return Capacity(
        kv_tokens_total=metrics.max_blocks * metrics.tokens_per_block,
        kv_tokens_used=metrics.used_blocks * metrics.tokens_per_block,
        max_sequences=metrics.max_requests,
        running=metrics.scheduled_requests,
        waiting=metrics.waiting_requests + metrics.pending_in_triton,
        # A replica that does not export the gauge reads 0: charge in single tokens then.
        kv_block_tokens=max(metrics.tokens_per_block, 1),
        prefix_hit_tokens=metrics.reused_blocks * metrics.tokens_per_block,
        salts_prefix_cache=False,  # no cache salt reaches it (module doc)
        max_sequence_tokens=max_sequence_tokens,
    )


def generate_body(
    req: GenerationRequest,
    *,
    end_id: int | None = None,
    pad_id: int | None = None,
    stop: bool = False,
    vocab_size: int | None = None,
) -> dict[str, Any]:
    """A `generate_stream` request in the `tensorrt_llm` contract: each input tensor by name, as the
    generate extension takes them (one request: Triton adds the batch dimension and converts each
    value to the type the model's config declares). `vocab_size`: the model's, the length of the
    `embedding_bias` row a request with a logit_bias needs."""
    body: dict[str, Any] = {
        "id": req.request_id,
        "input_ids": req.prompt_ids,
        "input_lengths": [len(req.prompt_ids)],
        "request_output_len": [req.max_new_tokens],
        "streaming": [True],
        # kv_cache_reused_blocks (the prefix-cache hit) and its two sibling outputs on every response.
        "return_kv_cache_reuse_stats": [True],
    }
    # TensorRT-LLM decodes greedily with top_k = 1; a temperature of 0 is not a value it takes. Nor
    # one below float32's smallest normal number, which the schema lets through (0 to 2): its FP32
    # tensor holds it as 0 or a denormal whose inverse is past float32's range, and the penalties
    # below, divided by it, were held at float32's largest. Such a temperature means greedy (the
    # engine's float64 division picks the greedy token too), so it travels as greedy does.
    greedy = req.temperature < FLOAT32_MIN_NORMAL
    body["runtime_top_k"] = [1 if greedy else req.top_k]
    body["temperature"] = [1.0 if greedy else req.temperature]
    body["runtime_top_p"] = [req.top_p]
    # Always a seed: TensorRT-LLM seeds a request without one with 0, so every unseeded request
    # with the same prompt and settings sampled the same reply (its maintainers: NVIDIA/TensorRT-LLM
    # issues 1000 and 2860), where OpenAI and vLLM sample afresh. The seed travels as UINT64: a
    # negative one wraps rather than failing the request.
    seed = req.seed if req.seed is not None else random.getrandbits(64)
    body["random_seed"] = [seed % 2**64]
    # Sent only when set: a model repository that does not declare them still takes the rest.
    if req.repetition_penalty != 1.0:
        body["repetition_penalty"] = [req.repetition_penalty]
    # TensorRT-LLM's penalty kernel scales the logits by 1 / temperature before it takes the presence
    # and frequency penalties off (penaltyKernels.cu: bias, temperature, repetition, presence,
    # frequency), where OpenAI and vLLM take them off first: sent divided by the temperature, they
    # weigh on the sample as they do there (at 0.2, five times the penalty it would otherwise be).
    # The repetition penalty scales, so its place against the temperature does not matter.
    scale = 1.0 if greedy else req.temperature
    if req.presence_penalty:
        body["presence_penalty"] = [_fp32(req.presence_penalty / scale)]
    if req.frequency_penalty:
        body["frequency_penalty"] = [_fp32(req.frequency_penalty / scale)]
    if req.logit_bias:
        body["embedding_bias"] = embedding_bias(req.logit_bias, vocab_size)
    if end_id is not None:
        body["end_id"] = [end_id]
    if req.min_tokens and end_id is not None and end_id >= 0:
        # TensorRT-LLM's min_length holds back the end_id alone (its logit masked until the reply
        # has min_length tokens; stop words end it whenever they come). Without an end id (-1:
        # ignore_eos) it has nothing to hold back, and releases without the kernel's end_id > -1
        # check masked the row's last token instead: not sent then.
        body["min_length"] = [req.min_tokens]
    if pad_id is not None:
        body["pad_id"] = [pad_id]
    if req.stop_ids:
        # [ids; end offsets] (every stop word here is one token long), flat: Triton reshapes it to
        # the declared [2, -1], where a nested list is refused unless each row holds one value.
        body["stop_words_list"] = [*req.stop_ids, *range(1, len(req.stop_ids) + 1)]
    if stop:
        body["stop"] = [True]
    return body


def requested_inputs(req: GenerationRequest, *, end_tokens: frozenset[int]) -> frozenset[str]:
    """The inputs generate_body sends for `req` only because it set their parameter ("sent only
    when set"): a replica whose model does not declare one refuses that request alone, and serves
    the rest (gpu_container/triton/refusals.py). `stop_words_list` is one only for stop ids other
    than the model's `end_tokens` (none when the request ignores them): the pipeline puts those
    among every request's stop ids, so a replica refusing them refuses everyone."""
    named = {
        "repetition_penalty": req.repetition_penalty != 1.0,
        "presence_penalty": bool(req.presence_penalty),
        "frequency_penalty": bool(req.frequency_penalty),
        "embedding_bias": bool(req.logit_bias),
        "min_length": bool(req.min_tokens),
        "stop_words_list": not set(req.stop_ids) <= end_tokens,
    }
    return frozenset(name for name, sent in named.items() if sent)


_FP32_MAX = 3.4028234663852886e38


def _fp32(value: float) -> float:
    """value held within float32's range: a penalty over a temperature near 0 would overflow the
    FP32 tensor Triton reads it into."""
    return max(-_FP32_MAX, min(value, _FP32_MAX))


def embedding_bias(logit_bias: tuple[tuple[int, float], ...], vocab_size: int | None) -> list[float]:
    """TensorRT-LLM's `embedding_bias` for a logit_bias: a row as long as the model's vocabulary
    (its executor refuses any other length), the bias at each named token and 0 elsewhere.

    The generate extension takes a tensor as JSON numbers only, so this is 4 bytes a token for
    Triton to parse (0.5 MB for Llama 3's 128k vocabulary), paid only by requests that send a
    logit_bias. An id outside the row is refused as the request's fault: the edge checks it against
    the same checkpoint first (edge/pipeline.py), so only a caller that skipped that meets it here.
    """
    if vocab_size is None:
        raise RequestRejected("logit_bias needs the model's vocabulary size, which this upstream lacks")
    row = [0.0] * vocab_size
    for token, bias in logit_bias:
        if not 0 <= token < vocab_size:
            raise RequestRejected(f"logit_bias has token id {token}, outside [0, {vocab_size})")
        row[token] = bias
    return row


def stop_body(request_id: str) -> dict[str, Any]:
    """The `stop` request for `request_id` (TensorRT-LLM's way to end a running request at once),
    with the inputs the contract requires of every request."""
    return generate_body(GenerationRequest(request_id, [0], max_new_tokens=1), stop=True)


class TritonUpstream:
    def __init__(
        self,
        name: str,
        http_url: str,
        metrics_url: str,
        *,
        model_name: str = MODEL_NAME,
        end_id: int | None = None,
        pad_id: int | None = None,
        extra_stop_ids: tuple[int, ...] = (),
        vocab_size: int | None = None,
        first_response_timeout_s: float = 30.0,
        stall_timeout_s: float = 60.0,
        capacity_ttl_s: float = 0.25,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self.name = name
        self.http_url = http_url.rstrip("/")
        self.metrics_url = metrics_url
        self.model_name = model_name
        self._end_id = end_id
        self._pad_id = pad_id
        # More end tokens than TensorRT-LLM's single end_id (e.g. Llama 3's <|eot_id|>).
        self._extra_stop_ids = extra_stop_ids
        # The model's vocabulary, which a logit_bias's embedding_bias row spans (None: a request
        # with a logit_bias is refused).
        self._vocab_size = vocab_size
        # A replica that goes silent mid-stream is as failed as one that never answers.
        self._first_timeout_s = first_response_timeout_s
        self._stall_timeout_s = stall_timeout_s
        self._capacity_ttl_s = capacity_ttl_s
        self._probe_timeout_s = probe_timeout_s
        address = urlsplit(self.http_url)
        self._pool = ConnectionPool(address.hostname or "127.0.0.1", address.port or 80)
        metrics = urlsplit(metrics_url)
        self._metrics_pool = ConnectionPool(metrics.hostname or "127.0.0.1", metrics.port or 80)
        self._metrics_path = metrics.path or "/metrics"
        self._request_head = (
            f"POST /v2/models/{model_name}/generate_stream HTTP/1.1\r\nHost: {address.netloc}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self._metrics_cache: tuple[float, TrtLlmMetrics] | None = None
        # The replica's KV block size (its tokens_per gauge), once its metrics have said it.
        self._block_tokens = 0
        # Its engine's longest prompt + reply as its model config last said it (0: it says none, or
        # not read yet). Read with the first capacity poll (sequence_limit.py), again after the
        # replica was down (`_config_read` False): a read that fails keeps the limit said before,
        # which a restart rarely changes, where 0 would have the edge send past it (the pipeline's
        # context back at the settings' guess) and call the reply the engine cuts "stop".
        self._max_seq_len = 0
        self._config_read = False
        # Whether the last read failed and said so: a config that stays unreadable (an API the
        # operator restricted) is asked each poll, and one warning, not one a second, says it.
        self._config_unread_logged = False
        self._stops: set[asyncio.Task[None]] = set()
        # The connections of the streams open now: a dead stub ends them all (triton_stub.py).
        self._streams: set[SseConnection] = set()
        # Set while the model's stub is dead (triton_stub.py): not ready, whatever Triton says.
        self._quarantine: StubQuarantine | None = None
        # The read of Triton's counts that takes in a stub's death, while it runs: one for all the
        # streams failing with it, and a task of the replica's own (_stub_died).
        self._stub_judge: asyncio.Task[None] | None = None
        # Set by aclose: a stream closed after it sends no `stop` (nothing would close the
        # connection it opens); the model's poll of closed streams drops its request instead.
        self._closed = False

    def _request(self, body: dict[str, Any]) -> bytes:
        payload = _encode_json(body)
        return b"%s%d\r\n\r\n%s" % (self._request_head, len(payload), payload)

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._deltas(req, None)

    def generate_direct(self, req: GenerationRequest, offer: DeltaSink) -> AsyncIterator[Delta]:
        """`generate`, the tokens of each loop pass's reads offered to `offer` in one callback for
        every stream (edge/upstreams/direct.py, triton_sse.py's `_RelayBatch`); what it declines
        comes through the iterator."""
        return self._deltas(req, offer)

    async def _deltas(self, req: GenerationRequest, offer: DeltaSink | None) -> AsyncIterator[Delta]:
        # TensorRT-LLM's end_id -1: no end token (the contract's ignore_eos); stop_ids still end it.
        end_id = -1 if req.ignore_eos else self._end_id
        merged_stops = bool(self._extra_stop_ids and not req.ignore_eos)
        if merged_stops:
            stops = [*req.stop_ids, *(t for t in self._extra_stop_ids if t not in req.stop_ids)]
            req = dataclasses.replace(req, stop_ids=stops)
        request = self._request(
            generate_body(req, end_id=end_id, pad_id=self._pad_id, vocab_size=self._vocab_size)
        )
        conn = await self._pool.connect(self._first_timeout_s)
        conn.send(request, offer, request_id=req.request_id)
        self._streams.add(conn)
        retried = False
        stop_tokens = set(req.stop_ids) | ({end_id} if end_id is not None else set())
        # The reply's room in the replica's sequence limit: TensorRT-LLM ends it there, unasked.
        limit = self._max_seq_len
        room = limit - len(req.prompt_ids) if limit else req.max_new_tokens
        first = True
        finished = False
        try:
            timeout_s = self._first_timeout_s
            while not finished:
                try:
                    await conn.wait(timeout_s)
                except TimeoutError:
                    raise UpstreamError(f"{self.name}: no response within {timeout_s:g} s") from None
                timeout_s = self._stall_timeout_s
                cached = 0
                if first and conn.tokens and conn.failure is None:
                    # The prefix-cache hit, reported on the delta carrying the first token as the
                    # in-process engine does. Awaited (the replica's block size, read once) before
                    # anything is taken: what arrives meanwhile, the end included, is taken with it.
                    cached = await self._cached_tokens(conn.reused_blocks, req.cache_salt)
                    first = False
                if (
                    conn.failure is not None
                    and conn.reused
                    and not conn.responded
                    and not conn.judged
                    and not retried
                ):
                    # A kept-alive connection the replica had closed while idle: nothing was read.
                    retried = True
                    timeout_s = self._first_timeout_s
                    self._streams.discard(conn)
                    conn = await self._pool.connect(self._first_timeout_s, fresh=True)
                    conn.send(request, offer, request_id=req.request_id)
                    self._streams.add(conn)
                    continue
                declined, conn.declined = conn.declined, None
                if declined is not None:
                    # Before a failure read after it: the relay may have counted, charged or
                    # written it in part already (edge/token_relay.py), and knows it by identity.
                    yield declined
                    continue
                if conn.failure is not None:
                    if is_stub_dead(conn.failure):
                        self._stub_died(conn, conn.failure)
                    # Reckoned only here: a failure is rare, and every request's set-up need not pay.
                    own = () if req.ignore_eos else (self._end_id, *self._extra_stop_ids)
                    requested = requested_inputs(req, end_tokens=frozenset(t for t in own if t is not None))
                    raise _stream_error(self.name, conn.failure, conn.status, requested, conn.model_error)
                if conn.relay_error is not None:
                    raise UpstreamError(f"relaying the output failed: {conn.relay_error!r}")
                tokens, conn.tokens = conn.tokens, []
                finished = conn.ended
                if finished:
                    reason = _finish_reason(
                        conn.last_token, stop_tokens, conn.received, req.max_new_tokens, room
                    )
                    yield Delta(tokens, reason, cached)
                elif tokens:
                    yield Delta(tokens, cached_tokens=cached)
        finally:
            self._streams.discard(conn)
            if finished:
                self._pool.release(conn)
            elif conn.failure is not None:
                conn.abort()
            elif conn.responded:
                conn.abort()
                self._stop_soon(req.request_id)
            else:
                # No answer yet: the request may still be on its way into the model, and a stop
                # that overtakes it (on a kept-alive connection, where the request's own is still
                # being accepted) finds nothing to stop. The connection stays open for the stop to
                # see the request's first answer, and stop it again then.
                conn.detach()
                self._stop_soon(req.request_id, conn)

    def _stub_died(self, failed: SseConnection, message: str) -> None:
        """The model's stub is dead (`message`, Triton's answer to `failed`): the other streams
        open here end now, where Triton would send them nothing more (each then fails over or ends
        with an error, as for any failed replica), and the replica is kept out until Triton's
        counts say it serves again (triton_stub.py).

        The counts are read by a task of the replica's own, which ready() waits for: read by the
        failed request, they held its failover for as long as the read took (up to the probe
        timeout), and a request cancelled meanwhile (its client gone) took the quarantine with it,
        the replica back in rotation at the next poll."""
        for conn in list(self._streams):
            if conn is not failed:
                conn.fail("ended: another request on this replica found its model's stub dead")
        if self._quarantine is not None or self._stub_judge is not None or self._closed:
            return
        judge = asyncio.get_running_loop().create_task(
            self._judge_stub(message), name=f"triton-stub-{self.name}"
        )
        self._stub_judge = judge
        judge.add_done_callback(self._stub_judged)

    async def _judge_stub(self, message: str) -> None:
        try:
            counts = await self._request_counts()
        except UpstreamError as exc:
            # Without them nothing could tell the stub back: the replica is suspect until its next
            # check passes, as for any failure.
            log.warning("triton_stub_dead_unjudged", replica=self.name, error=message, detail=str(exc))
            return
        self._quarantine = StubQuarantine.since(counts)
        log.warning("triton_stub_dead", replica=self.name, error=message, counts=counts)

    def _stub_judged(self, judge: asyncio.Task[None]) -> None:
        # A done callback, not the task's own `finally`: a task cancelled before it ran has none.
        if self._stub_judge is judge:
            self._stub_judge = None

    async def _request_counts(self) -> RequestCounts:
        status, body = await self._pool.get(f"/v2/models/{self.model_name}/stats", self._probe_timeout_s)
        if status != 200:
            raise UpstreamError(f"{self.name}: model statistics: HTTP {status}")
        try:
            return parse_request_counts(body)
        except ValueError as exc:
            raise UpstreamError(f"{self.name}: {exc}") from exc

    async def _stub_back(self) -> bool:
        """Whether the replica serves again after its stub died (always, where none did)."""
        if self._stub_judge is not None:
            # A stub death being taken in: its verdict first, bounded by the probe timeout (this
            # poll's own timeout leaves the read running).
            await asyncio.wait([self._stub_judge])
        quarantine = self._quarantine
        if quarantine is None:
            return True
        try:
            counts = await self._request_counts()
        except UpstreamError:
            return False
        if not quarantine.lifted_by(counts):
            return False
        self._quarantine = None
        log.info("triton_stub_back", replica=self.name, counts=counts)
        return True

    async def _cached_tokens(self, reused: int | None, cache_salt: str) -> int:
        """Prompt tokens the replica found in its prefix cache: reused blocks x its block size; 0
        for a salted request, which the replica cannot keep to its salt's blocks (module doc)."""
        if not reused or cache_salt:
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

    def _stop_soon(self, request_id: str, unanswered: SseConnection | None = None) -> None:
        """Send the `stop` request for `request_id` from a task of its own: a generator that is
        being closed or cancelled cannot wait for the reply. `unanswered`: the stream's connection,
        where no answer had come yet; the task watches it, and closes it when done."""
        if self._closed:
            if unanswered is not None:
                unanswered.abort()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # No loop left (interpreter shutdown): the model's poll still drops the request.
            if unanswered is not None:
                unanswered.abort()
            return
        task = loop.create_task(self._stop(request_id, unanswered), name=f"triton-stop-{request_id}")
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, request_id: str, unanswered: SseConnection | None) -> None:
        try:
            await self._send_stop(request_id)
            if unanswered is not None and await self._answers_after_stop(unanswered):
                # The stop came before the request: the request answers now that it runs.
                await self._send_stop(request_id)
        except UpstreamError as exc:
            # Not fatal: the model's poll of closed streams drops the request a little later.
            log.info("triton_stop_failed", replica=self.name, request_id=request_id, error=repr(exc))
        finally:
            if unanswered is not None:
                unanswered.abort()

    async def _send_stop(self, request_id: str) -> None:
        status, body = await self._pool.fetch(
            self._request(stop_body(request_id)), "stop", self._probe_timeout_s
        )
        if status != 200:
            raise UpstreamError(f"HTTP {status}: {body[:300]!r}")

    async def _answers_after_stop(self, conn: SseConnection) -> bool:
        """Whether the stream's request, stopped before it had answered, still runs: it answers
        with tokens rather than ending (a stop that found it ends it; one it overtook did nothing).
        Bounded as the stream's first answer is."""
        try:
            await conn.wait(self._first_timeout_s)
        except TimeoutError:
            return False
        return not conn.ended and conn.failure is None

    async def _metrics(self) -> TrtLlmMetrics:
        now = time.monotonic()
        if self._metrics_cache is not None and now - self._metrics_cache[0] < self._capacity_ttl_s:
            return self._metrics_cache[1]
        try:
            status, page = await self._metrics_pool.get(self._metrics_path, self._probe_timeout_s)
        except UpstreamError as exc:
            raise UpstreamError(f"{self.name}: metrics unavailable: {exc}") from exc
        if status != 200:
            raise UpstreamError(f"{self.name}: metrics unavailable: HTTP {status}")
        metrics = parse_trtllm_metrics(page.decode(errors="replace"), self.model_name)
        self._metrics_cache = (time.monotonic(), metrics)
        self._block_tokens = metrics.tokens_per_block
        return metrics

    async def metrics(self) -> TrtLlmMetrics:
        """The replica's nv_trt_llm_* gauges, fresh (not cached)."""
        self._metrics_cache = None
        return await self._metrics()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until the replica has no request left and no final response left to send, those
        of streams cut short included (our CPU model's unsent_final_responses; TensorRT-LLM's
        backend has only `active`). False on timeout or an unreadable page."""
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    page = await self.metrics()
                    if not page.active_requests and not page.unsent_final_responses:
                        return True
                except UpstreamError:
                    return False
                await anyio.sleep(IDLE_POLL_S)  # a metrics page: nothing to wait on but a poll
        return False

    async def capacity(self) -> Capacity:
        metrics = await self._metrics()
        if not self._config_read:
            said = await self._read_max_seq_len()
            if said is not None:
                self._max_seq_len, self._config_read = said, True
        return trtllm_capacity(metrics, self._max_seq_len)

    async def _read_max_seq_len(self) -> int | None:
        """The sequence limit the replica's model config says (0: none), or None where the config
        could not be read (asked again with the next poll). Once while the replica stays ready: an
        engine is built with its limit, and another engine means a restart, which ready() sees."""
        try:
            status, body = await self._pool.get(f"/v2/models/{self.model_name}/config", self._probe_timeout_s)
        except UpstreamError as exc:
            self._config_unread(error=str(exc))
            return None
        if status != 200:
            self._config_unread(status=status)
            return None
        self._config_unread_logged = False
        return reported_max_seq_len(body)

    def _config_unread(self, **why: object) -> None:
        """The first failed read of a run says so; those after it, each poll, do not."""
        if not self._config_unread_logged:
            self._config_unread_logged = True
            log.warning("triton_model_config_unread", replica=self.name, **why)

    async def ready(self) -> bool:
        """Triton's own readiness and the model's (KServe v2 health endpoints), and a model whose
        stub died seen serving again (triton_stub.py): Triton's readiness does not say that.

        Triton's readiness is asked on a new connection: a tritonserver told to stop (SIGTERM)
        drains by closing each new connection unanswered, while on those already open it says it
        is ready and takes new inferences until its exit timeout, when it exits and cuts them.
        Asked on a kept-alive connection, it kept the replica in rotation through its drain. A
        replica not ready keeps no idle connection (ConnectionPool.keep_idle): they held its drain
        open until that timeout."""
        try:
            server, _ = await self._pool.get("/v2/health/ready", self._probe_timeout_s, new=True)
            model, _ = await self._pool.get(f"/v2/models/{self.model_name}/ready", self._probe_timeout_s)
        except UpstreamError:
            server = model = 0
        if server == 200 and model == 200 and await self._stub_back():
            self._pool.keep_idle(True)
            return True
        self._pool.keep_idle(False)
        self._config_read = False  # back up, it may run another engine: its config is read again
        return False

    async def aclose(self) -> None:
        self._closed = True
        judge = self._stub_judge
        if judge is not None:
            # Its connection is closed with it, not left open after the server may be stopped.
            judge.cancel()
            await asyncio.gather(judge, return_exceptions=True)
        # Stops still in flight are bounded by the probe timeout; past it they are cancelled (their
        # connections closed with them), not left to finish after the server may be stopped.
        if self._stops:
            _, pending = await asyncio.wait(list(self._stops), timeout=self._probe_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._pool.aclose()
        await self._metrics_pool.aclose()


def _stream_error(
    name: str, message: str, status: int, requested_inputs: frozenset[str], model_error: bool
) -> RequestRejected | UpstreamError:
    """A refusal of the request's own parameters, or the replica's failure: a 400 is the request's
    but for Triton's own checks of the inputs the edge sends, which say the replica's model differs
    from the contract (gpu_container/triton/refusals.py) unless they name an input sent only for a
    parameter this request set (`requested_inputs`). The status of the model's own error
    (`model_error`) is not Triton's to trust: that one is known by its text alone."""
    invalid_argument = status == 400 and not model_error
    reason = refusal_reason(message, invalid_argument=invalid_argument, requested_inputs=requested_inputs)
    if reason is not None:
        return ContextLengthExceeded(reason) if exceeds_context(reason) else RequestRejected(reason)
    where = f"{name}: HTTP {status}" if status not in (0, 200) else name
    return UpstreamError(f"{where}: {message}")


def _finish_reason(
    last: int | None, stop_tokens: set[int], generated: int, limit: int, room: int
) -> FinishReason:
    """`limit`: the request's max_new_tokens; `room`: what the replica's sequence limit leaves the
    reply (where the engine ends it unasked, as if it had finished: "length" as vLLM says)."""
    if last is not None and last in stop_tokens:
        return "stop"
    if generated >= limit or generated >= room:
        return "length"
    # TensorRT-LLM leaves the end token out of its output: ending early means it saw one.
    return "stop"


def _replica_urls(spec: str) -> tuple[str, str]:
    """`host:http_port[:metrics_port]` -> (Triton's HTTP URL, metrics URL); metrics default to 8002."""
    address = parse_replica_address(spec)
    host = address.host
    return f"http://{host}:{address.http_port}", f"http://{host}:{address.metrics_port}/metrics"


def remote_triton_upstream(
    spec: str,
    *,
    end_id: int | None = None,
    pad_id: int | None = None,
    extra_stop_ids: tuple[int, ...] = (),
    model_name: str = MODEL_NAME,
    vocab_size: int | None = None,
) -> TritonUpstream:
    """A running replica at `HOST:HTTP_PORT[:METRICS_PORT]`, named `triton-HOST:HTTP_PORT` (with
    `/MODEL` when it serves a Triton model other than tensorrt_llm: one server, several models)."""
    http_url, metrics_url = _replica_urls(spec)
    suffix = "" if model_name == MODEL_NAME else f"/{model_name}"
    return TritonUpstream(
        f"triton-{http_url.removeprefix('http://')}{suffix}",
        http_url,
        metrics_url,
        model_name=model_name,
        end_id=end_id,
        pad_id=pad_id,
        extra_stop_ids=extra_stop_ids,
        vocab_size=vocab_size,
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
    vocab_size: int | None = None,
    served_as: str = "",
) -> tuple[list[Upstream], Callable[[], Awaitable[None]]]:
    """Upstreams for `--triton local` (start tritonserver here over the CPU repository serving
    `model_dir`) or `--triton HOST:PORT[:METRICS_PORT],...` (running replicas).

    `served_as`: the served model's name beside other models ([models.*]): each starts a local
    tritonserver of its own, named after it, or readiness and the replica metrics would take the
    two for one.

    Returns the upstreams (a local server's as PrivateUpstreams: no other edge instance reaches it)
    and an async cleanup that closes them and stops a local server.
    """
    if spec.strip() == "local":
        repo_dir = Path(tempfile.mkdtemp(prefix="floodgate-cpu-repo-"))
        render_cpu_repository(repo_dir, model_dir, engine_cfg, model_name=model_name)
        server = await anyio.to_thread.run_sync(start_local_triton, repo_dir)
        suffix = "" if model_name == MODEL_NAME else f"/{model_name}"
        local = TritonUpstream(
            f"{served_as}/triton-local" if served_as else f"triton-local{suffix}",
            server.http_url,
            server.metrics_url,
            model_name=model_name,
            end_id=end_id,
            pad_id=pad_id,
            vocab_size=vocab_size,
        )

        async def stop_local() -> None:
            # Shielded: a server shutting down cancels its lifespan, and tritonserver must not outlive it.
            with anyio.CancelScope(shield=True):
                # Streams the drain has just cut may still owe their final responses: a SIGTERM
                # before those are out crashes tritonserver in the unload (gpu_container/triton/
                # README.md). Bounded as the server's own exit timeout is.
                await local.wait_idle(EXIT_TIMEOUT_S)
                await local.aclose()
                await anyio.to_thread.run_sync(server.stop)
                shutil.rmtree(repo_dir, ignore_errors=True)

        # This process's own tritonserver: `serve --workers N` starts one per worker.
        return PrivateUpstreams([local]), stop_local

    upstreams: list[Upstream] = [
        remote_triton_upstream(
            item,
            end_id=end_id,
            pad_id=pad_id,
            extra_stop_ids=extra_stop_ids,
            model_name=model_name,
            vocab_size=vocab_size,
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
    `asg:GROUP[:HTTP_PORT[:METRICS_PORT]]` finds them in an Auto Scaling group (triton_fleet.py).
    `model_name`: the Triton model the replicas serve ([models.NAME] triton_model)."""

    @asynccontextmanager
    async def provide(settings: Settings, model_dir: Path) -> AsyncIterator[list[Upstream]]:
        facts = read_facts(model_dir)
        end_id = facts.end_id
        tokens: dict[str, Any] = {
            "end_id": end_id,
            "pad_id": end_id,
            "extra_stop_ids": tuple(token for token in facts.eos_token_ids if token != end_id),
            "model_name": model_name,
            # config.json's, as the engine the replica runs was built from the same checkpoint.
            "vocab_size": facts.config.vocab_size,
        }
        if is_asg_spec(spec):
            make = functools.partial(remote_triton_upstream, **tokens)
            async with discovered_triton_upstreams(spec, settings, make) as discovered:
                yield discovered
            return
        engine_cfg = settings.engine.engine_config()
        served_as = settings.model.name if settings.models else ""
        upstreams, cleanup = await build_triton_upstreams(
            spec, model_dir, engine_cfg, served_as=served_as, **tokens
        )
        try:
            yield upstreams
        finally:
            with anyio.CancelScope(shield=True):
                await cleanup()

    return provide

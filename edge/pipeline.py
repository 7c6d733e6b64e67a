"""One chat completion, read top to bottom.

Before the response starts (errors are plain HTTP statuses): count the prompt's tokens → ask the
limiter → ask the admission queue whether waiting makes sense. Then, with the stream open: first
event (it carries the request id) → wait for a replica slot, sending keep-alive comments → relay
the replica's token ids as text, charging each token to the limiter's lease → final chunk → usage
chunk → [DONE]. Whatever happens, the `finally` settles the lease, releases the slot, records the
metrics and logs one line.

How a stream ends, in its final chunk (OpenAI has no finish_reason for these two, so the standard
one is kept and a top-level `floodgate` object says what happened):

- cancelled (cancel endpoint): `finish_reason: "stop"` and `"floodgate": {"cancelled": true}`
- the user's token budget ran out mid-generation: `finish_reason: "length"` and
  `"floodgate": {"limit_reached": "tokens"}`

A failure once the stream is open (the replica died, the queue wait grew too long, the server's
drain deadline, the key revoked or expired: edge/keys/stream_watch.py) is an event
`data: {"error": {...}}` followed by `data: [DONE]`, never a hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import anyio
import structlog

from edge import metrics
from edge.admission.cache_scope import PrefixCacheScope, cache_salt
from edge.admission.dispatcher import Dispatcher
from edge.admission.prefix_index import routing_hashes
from edge.admission.slot import Slot
from edge.admission.ticket import Overloaded, Ticket
from edge.cancel.live import LiveRequest
from edge.cancel.registry import RequestRegistry
from edge.cancel.scope import cancel_scope
from edge.cancel.stream_close import aclose_stream
from edge.config import TierConfig
from edge.drain import Drain
from edge.errors import ApiError, invalid_request, rate_limited, retry_after_headers, wait_text
from edge.keys.authenticator import refusal
from edge.keys.principal import Principal
from edge.keys.stream_watch import StreamWatch
from edge.log_line import info_line
from edge.metric_children import child
from edge.models.token_weight import weighted
from edge.prompt_encoding import encode_messages
from edge.request_ids import new_request_id
from edge.schemas import ChatCompletionRequest, unknown_model
from edge.sse import DONE, KEEPALIVE, ChunkEncoder, event, usage_dict
from edge.text.chat_template import ChatTemplateError
from edge.text.model_text import ModelText
from edge.text.stops import StopMatcher
from edge.token_relay import TextSink, TokenRelay
from edge.upstreams.base import Delta, GenerationRequest, RequestRejected, UpstreamError
from edge.upstreams.direct import GenerateDirect
from limiter.base import Limiter, OutputLease, StoreUnavailable
from limiter.headers import ratelimit_headers

log = structlog.get_logger("floodgate.request")

_T = TypeVar("_T")

Emit = Callable[[bytes], Awaitable[None]]
EndReason = Literal[
    "stop",
    "length",
    "cancelled",
    "error",
    "rejected",
    "overloaded",
    "disconnected",
    "drained",
    "key_inactive",
]

CANCELLED_MARKER: dict[str, Any] = {"cancelled": True}


class UsageSink(Protocol):
    """Where a settled request's charged tokens go (the usage writer): must not wait."""

    def record(self, user: str, model: str, input_tokens: int, output_tokens: int) -> bool: ...


class MessageSink(Protocol):
    """Where a named conversation's turn goes (the message writer): the prompt when the request
    reaches a replica, the reply when it ends."""

    def record_prompt(self, conversation_id: str, user: str, request_id: str, prompt: str) -> None: ...

    def record_reply(
        self, conversation_id: str, user: str, request_id: str, reply: str, finish_reason: str
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    model_name: str
    max_model_len: int
    keepalive_s: float
    tiers: dict[str, TierConfig]
    # Per model (edge/models/): what each of its tokens counts against a user's token budget, and
    # the sampling a request that omits temperature / top_p / top_k / repetition_penalty gets
    # (edge/models/sampling.py: the checkpoint's generation_config, as vLLM applies it).
    token_weight: float = 1.0
    default_temperature: float = 1.0
    default_top_p: float = 1.0
    default_top_k: int = 0
    default_repetition_penalty: float = 1.0
    # Whose prefix cache a request may hit ([admission] prefix_cache_scope).
    prefix_cache_scope: PrefixCacheScope = "user"


@dataclass(slots=True)
class Outcome:
    """How one admitted request went, filled in as it runs."""

    reason: EndReason = "error"  # until something better is known
    marker: dict[str, Any] | None = None
    completion_tokens: int = 0
    # Prompt tokens the replica served from its prefix cache (Delta.cached_tokens).
    cached_tokens: int = 0
    text: list[str] = field(default_factory=list)
    # Text of the reply's last delta, written with the closing events in one write (`stream`).
    held: list[str] = field(default_factory=list)
    error: ApiError | None = None  # a failure after admission: an error event, or the status
    upstream: str = ""
    ttft_s: float | None = None

    @property
    def finish_reason(self) -> str:
        return "length" if self.reason == "length" else "stop"


class Pipeline:
    def __init__(
        self,
        config: PipelineConfig,
        text: ModelText,
        limiter: Limiter,
        dispatcher: Dispatcher,
        registry: RequestRegistry,
        messages: MessageSink | None = None,
        usage: UsageSink | None = None,
        drain: Drain | None = None,
        key_watch: StreamWatch | None = None,
    ) -> None:
        self.config = config
        self.text = text
        self.limiter = limiter
        self.dispatcher = dispatcher
        self.registry = registry
        self.messages = messages
        self.usage = usage
        # Never begun unless the server drains (edge/server.py): then it cuts streams at its deadline.
        self.drain = drain or Drain(accept_s=0.0, deadline_s=0.0)
        # Ends a generation whose key stops being active; None: keys are checked at admission only.
        self.key_watch = key_watch

    async def admit(self, principal: Principal, req: ChatCompletionRequest) -> Generation:
        """Everything decided before the response starts; raises ApiError for a 4xx/5xx answer."""
        arrived = time.perf_counter()
        tier = self.config.tiers.get(principal.tier)
        if tier is None:
            raise ApiError(403, f"Your key's tier {principal.tier!r} is not configured.", code="unknown_tier")
        if req.model and req.model != self.config.model_name:  # empty: the tier's default (edge/models/)
            raise unknown_model(req.model)
        logit_bias = self._logit_bias(req)
        stop_token_ids = self._stop_token_ids(req)
        # OpenAI's `developer` role is its newer name for `system` (what it says for o1 and later);
        # chat templates know only `system`, and SmolLM2's would add its own default system prompt
        # in front of a `developer` turn it renders as a turn of its own.
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages
        ]
        salt = cache_salt(principal.user, self.config.prefix_cache_scope)
        try:
            prompt_ids = await encode_messages(self.text.encode_chat, messages, salt, req.prompt_end)
        except ChatTemplateError as exc:
            raise invalid_request(f"The chat template rejected these messages: {exc}", "messages") from None
        # The model's context first: a client that trims its history on context_length_exceeded
        # must get that code for a prompt too long for both.
        max_new = self._max_new_tokens(req, tier, len(prompt_ids))
        counted = weighted(len(prompt_ids), self.config.token_weight)
        if counted > tier.tokens_per_window:
            # No wait would ever admit it: say so now instead of a 429 whose Retry-After lies. On a
            # weighted model, what it counts as: the budget is in weighted tokens.
            weight = self.config.token_weight
            as_counted = (
                "" if counted == len(prompt_ids) else f", {counted} tokens at this model's weight {weight:g}"
            )
            raise invalid_request(
                f"The messages are {len(prompt_ids)} tokens{as_counted}, more than your tier's whole "
                f"token budget ({tier.tokens_per_window} tokens per {tier.token_window_s:g}s). "
                "Please shorten them.",
                "messages",
                code="tokens_exceed_budget",
            )
        min_tokens = self._min_tokens(req, max_new)

        request_id = new_request_id()
        # Bound for the rest of this request's task: every log line it causes carries the id.
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            admission = await self.limiter.admit(principal.user, request_id, tier, len(prompt_ids), max_new)
        except StoreUnavailable as exc:
            raise self._refused(
                principal,
                request_id,
                ApiError(
                    503,
                    "Rate limiting is unavailable; please retry shortly.",
                    code="limiter_unavailable",
                    headers=retry_after_headers(exc.retry_after_s),
                ),
            ) from None
        decision = admission.decision
        headers = ratelimit_headers(decision)
        if not decision.allowed or admission.lease is None:
            limit = decision.limit or "requests"
            # OpenAI's shape: the limit as the type, "rate_limit_exceeded" as the code (clients
            # test the code to tell a rate limit from other 429s).
            wait = wait_text(decision.retry_after_ms / 1000)
            raise self._refused(
                principal,
                request_id,
                ApiError(
                    429,
                    f"Rate limit reached ({limit}). Please try again in {wait}.",
                    type=limit,
                    code="rate_limit_exceeded",
                    headers=headers,
                ),
            )
        ticket = Ticket(
            request_id=request_id,
            user=principal.user,
            priority=tier.priority,
            kv_tokens=len(prompt_ids) + max_new,
            max_wait_s=tier.max_queue_wait_s,
            # Tiers above the lowest priority are the paying ones: only they may use the reserve.
            may_use_reserve=tier.priority > 0,
            tier=principal.tier,
            prefix_keys=routing_hashes(prompt_ids, salt),
            prompt_tokens=len(prompt_ids),
        )
        try:
            self.dispatcher.precheck(ticket)
        except Overloaded as exc:
            await admission.lease.settle(ran=False)
            raise self._refused(principal, request_id, overloaded_error(exc, headers)) from None
        child(metrics.PROMPT_TOKENS, self.dispatcher.model, principal.tier).inc(len(prompt_ids))
        upstream_req = GenerationRequest(
            request_id=request_id,
            prompt_ids=prompt_ids,
            max_new_tokens=max_new,
            temperature=self.config.default_temperature if req.temperature is None else req.temperature,
            top_p=self.config.default_top_p if req.top_p is None else req.top_p,
            top_k=self.config.default_top_k if req.top_k is None else max(req.top_k, 0),
            seed=req.replica_seed,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=(
                self.config.default_repetition_penalty
                if req.repetition_penalty is None
                else req.repetition_penalty
            ),
            logit_bias=logit_bias,
            stop_ids=self._stop_ids(req, stop_token_ids),
            ignore_eos=req.ignore_eos,
            min_tokens=min_tokens,
            priority=tier.priority,
            cache_salt=salt,
        )
        return Generation(
            self,
            principal,
            req,
            upstream_req,
            ticket,
            admission.lease,
            {**headers, "x-request-id": request_id},
            arrived,
        )

    def _refused(self, principal: Principal, request_id: str, error: ApiError) -> ApiError:
        """A refusal after the request got its id (the limiter's 429 or 503, the queue's): the id
        travels in `x-request-id`, as on an admitted request's response, and one log line carries
        it, so a client quoting the id of a 429 it was given can be found in the logs."""
        error.headers["x-request-id"] = request_id
        info_line(
            log,
            "chat_refused",
            {
                "request_id": request_id,
                "user": principal.user,
                "tier": principal.tier,
                "model": self.config.model_name,
                "status": error.status,
                "code": error.detail.code,
            },
        )
        return error

    def _logit_bias(self, req: ChatCompletionRequest) -> tuple[tuple[int, float], ...]:
        """The request's logit_bias as the replicas take it, zero biases left out (they change
        nothing, and a request left with none sends Triton no [vocab] row). A token id outside the
        model's vocabulary is refused here by name, as OpenAI and vLLM refuse it: the engine would
        refuse it too, but without naming the parameter, and TensorRT-LLM's row has no place for it."""
        if not req.logit_bias:
            return ()
        self._refuse_outside_vocabulary(sorted(req.logit_bias), "key", "logit_bias")
        return tuple((token, float(bias)) for token, bias in req.logit_bias.items() if bias)

    def _stop_token_ids(self, req: ChatCompletionRequest) -> tuple[int, ...]:
        """The request's stop_token_ids, each once. One outside the model's vocabulary is refused
        here by name, as logit_bias's are: no token could ever match it, and the engine refuses it."""
        if not req.stop_token_ids:
            return ()
        self._refuse_outside_vocabulary(req.stop_token_ids, "value", "stop_token_ids")
        return tuple(dict.fromkeys(req.stop_token_ids))

    def _refuse_outside_vocabulary(self, tokens: list[int], what: str, param: str) -> None:
        """A 400 naming `param` for the first of `tokens` that is not one of this model's ids."""
        vocab = self.text.vocab_size
        outside = next((token for token in tokens if not 0 <= token < vocab), None)
        if outside is not None:
            raise invalid_request(
                f"Invalid {what} in '{param}': {outside}. This model's token ids are 0 to {vocab - 1}.",
                param,
                code="invalid_value",
            )

    def _stop_ids(self, req: ChatCompletionRequest, stop_token_ids: tuple[int, ...]) -> list[int]:
        """The tokens that end the reply: the model's end tokens (none with ignore_eos) and the
        request's stop_token_ids."""
        stop_ids = [] if req.ignore_eos else self.text.eos_token_ids
        if stop_token_ids:
            stop_ids = [*stop_ids, *(token for token in stop_token_ids if token not in stop_ids)]
        return stop_ids

    def _min_tokens(self, req: ChatCompletionRequest, max_new: int) -> int:
        """min_tokens, which cannot exceed the max_tokens the request gets (asked for, or what its
        tier and the model's context leave): vLLM refuses it too, and the reply could not hold it."""
        min_tokens = req.min_tokens or 0
        if min_tokens > max_new:
            asked = req.requested_max_tokens
            if asked is not None:
                param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
                limit = f"{param} ({asked})"
            else:
                limit = f"the {max_new} tokens your tier and the model's context leave this request"
            raise invalid_request(f"min_tokens must be at most {limit}, got {min_tokens}.", "min_tokens")
        return min_tokens

    def _max_new_tokens(self, req: ChatCompletionRequest, tier: TierConfig, prompt_tokens: int) -> int:
        asked = req.requested_max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        room = self.config.max_model_len - prompt_tokens
        if room < 1:
            # A prompt the context cannot hold whatever the completion: the client must trim its
            # messages, which only this code tells it, even when max_tokens is over its tier too.
            raise self._context_exceeded(prompt_tokens, asked or 1)
        if asked is not None and asked > tier.max_tokens:
            raise invalid_request(
                f"{param} is too large: {asked}. Your tier allows at most {tier.max_tokens}.", param
            )
        max_new = asked if asked is not None else min(tier.max_tokens, room)
        if max_new > room:
            raise self._context_exceeded(prompt_tokens, max_new)
        return max_new

    def _context_exceeded(self, prompt_tokens: int, completion_tokens: int) -> ApiError:
        return invalid_request(
            f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
            f"requested {prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, "
            f"{completion_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            "messages",
            code="context_length_exceeded",
        )


def overloaded_error(exc: Overloaded, headers: dict[str, str] | None = None) -> ApiError:
    """Queue full or too slow: 429, as a rate limit. No replica at all: 503, the service is down."""
    message = f"The service is overloaded ({exc.reason}). Please try again in {wait_text(exc.retry_after_s)}."
    if exc.reason == "no_replica":
        message = f"No model replica is available. Please try again in {wait_text(exc.retry_after_s)}."
        return ApiError(
            503,
            message,
            code=exc.reason,
            headers={**(headers or {}), **retry_after_headers(exc.retry_after_s)},
        )
    return rate_limited(message, exc.reason, exc.retry_after_s, headers)


def shutting_down_error(retry_after_s: float = 0.0) -> ApiError:
    """This instance is draining (SIGTERM): another instance will take the request."""
    return ApiError(
        503,
        "This server is shutting down. Please retry; another instance will take the request.",
        code="server_shutting_down",
        headers=retry_after_headers(max(retry_after_s, 1.0)),
    )


class _KeepAlive:
    """SSE comments while nothing else is sent, so load balancers keep an idle stream open.

    A timer until the first comment is due, a task only from then on: most streams get their
    first token sooner, and a timer costs far less to set and cancel than a task."""

    def __init__(self, emit: Emit, interval_s: float) -> None:
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(interval_s, self._start, emit, interval_s)

    def _start(self, emit: Emit, interval_s: float) -> None:
        self._task = asyncio.ensure_future(self._beat(emit, interval_s))

    @staticmethod
    async def _beat(emit: Emit, interval_s: float) -> None:
        while True:
            await emit(KEEPALIVE)
            await asyncio.sleep(interval_s)

    async def stop(self) -> None:
        self._timer.cancel()
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait({self._task})
        if not self._task.cancelled():
            self._task.exception()  # retrieved so asyncio does not report it; the stream ends anyway


class Generation:
    """An admitted request: run it once, as a stream (`stream`) or as one answer (`complete`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        principal: Principal,
        req: ChatCompletionRequest,
        upstream_req: GenerationRequest,
        ticket: Ticket,
        lease: OutputLease,
        headers: dict[str, str],
        arrived: float,
    ) -> None:
        self._p = pipeline
        self._principal = principal
        self._req = req
        self._upstream_req = upstream_req
        self._ticket = ticket
        self._lease = lease
        self.headers = headers
        self._arrived = arrived
        self.request_id = upstream_req.request_id
        self.created = int(time.time())
        self._live: LiveRequest = pipeline.registry.register(self.request_id, principal.user)
        self._slot: Slot | None = None
        self._deltas: AsyncIterator[Delta] | None = None
        self._keepalive: _KeepAlive | None = None
        self._reached_replica = False
        # The replica refused the request, or failed before the client got any of its text: the
        # client got only an error, and is charged nothing for it (OpenAI bills no 4xx or 5xx).
        self._answered_nothing = False
        self._closed = False

    @property
    def prompt_tokens(self) -> int:
        return len(self._upstream_req.prompt_ids)

    @property
    def _charged(self) -> bool:
        """Whether the user pays for the request: it reached a replica and got an answer (a request
        turned away, cancelled while queued, or answered with an error alone costs it nothing)."""
        return self._reached_replica and not self._answered_nothing

    async def stream(self, emit: Emit, end: Emit, write_now: Callable[[bytes], bool] | None = None) -> None:
        """Write the events with `emit`; the last ones with `end`, which also ends the response.
        `write_now`, where the server offers it (edge/body_chunks.py), writes a token's event at once
        when nothing would make it wait: no coroutine and no ASGI send for that token."""
        enc = ChunkEncoder(self.request_id, self._p.config.model_name, self.created)
        out = Outcome()
        keep_text = self._req.conversation_id is not None

        def on_text(text: str) -> Awaitable[None] | None:
            if keep_text:
                out.text.append(text)
            chunk = enc.delta(text)
            if write_now is not None and write_now(chunk):
                return None
            return emit(chunk)

        try:
            await emit(enc.first())
            await self._run(out, on_text, emit)
            closing: list[bytes] = []
            if out.held:
                text = "".join(out.held)
                closing.append(enc.delta(text))
                if keep_text:
                    out.text.append(text)
            if out.error is not None:
                closing.append(event({"error": out.error.detail}))
                if out.reason in ("drained", "key_inactive") and self._req.include_usage:
                    # Cut by a shutdown or its key: the tokens it got were charged, so say how many.
                    closing.append(enc.usage(self.prompt_tokens, out.completion_tokens, out.cached_tokens))
            else:
                closing.append(enc.final(out.finish_reason, out.marker))
                if self._req.include_usage:
                    closing.append(enc.usage(self.prompt_tokens, out.completion_tokens, out.cached_tokens))
            closing.append(DONE)
        except anyio.get_cancelled_exc_class():
            out.reason = "disconnected"
            raise
        finally:
            await self.close(out)
        # Closed first: when the client sees the stream end, the lease is settled, the slot free and
        # the request logged. Then the last text, the closing events and the end of the body go out
        # in one write (one syscall, not five): all were ready at once, so none waited for another.
        await end(b"".join(closing))

    async def complete(self) -> dict[str, Any]:
        out = Outcome()

        try:
            await self._run(out, out.text.append, None)
            out.text += out.held
        except anyio.get_cancelled_exc_class():
            out.reason = "disconnected"
            raise
        finally:
            await self.close(out)
        if out.error is not None:
            out.error.headers = {**self.headers, **out.error.headers}
            raise out.error
        body: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self._p.config.model_name,
            "request_id": self.request_id,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(out.text)},
                    "finish_reason": out.finish_reason,
                }
            ],
            "usage": usage_dict(self.prompt_tokens, out.completion_tokens, out.cached_tokens),
        }
        if out.marker:
            body["floodgate"] = out.marker
        return body

    async def _run(self, out: Outcome, on_text: TextSink, keepalive: Emit | None) -> None:
        if keepalive is not None:
            self._keepalive = _KeepAlive(keepalive, self._p.config.keepalive_s)
        # One scope for the three cancellers: the cancel endpoint (LiveRequest.cancel), the drain's
        # deadline (Drain.watch) and the key's end (StreamWatch.watch). A cancel marks the request
        # cancelled, which `LiveRequest.end` reports first below; the key watch says the status it
        # found; a scope cancelled otherwise was cut by the drain.
        scope = self._live.scope()
        drain = self._p.drain
        drain.watch(scope)
        keys = self._p.key_watch
        key = self._principal.key_sha256
        if keys is not None and key:
            keys.watch(key, self._principal.expires, scope)
        key_status: str | None = None
        try:
            with scope:
                await self._place_and_relay(out, on_text)
        except Overloaded as exc:
            out.reason = "overloaded"
            out.error = overloaded_error(exc)
        except RequestRejected as exc:
            # The request's own fault: a 400 for it alone, and the replica is not blamed.
            log.info("request_rejected_by_replica", request_id=self.request_id, error=str(exc))
            if self._slot is not None:
                self._slot.discard()  # no failure mark, no service-rate sample
            out.reason = "rejected"
            out.error = invalid_request(f"The model replica refused this request: {exc}", None)
            self._answered_nothing = True
        except UpstreamError as exc:
            log.warning("upstream_failed", request_id=self.request_id, upstream=out.upstream, error=str(exc))
            out.reason = "error"
            out.error = ApiError(
                502, "The model replica failed while generating.", type="api_error", code="upstream_error"
            )
            # Streamed, the tokens before the failure reached the client; not, it gets the error alone.
            self._answered_nothing = out.ttft_s is None or not self._req.stream
        finally:
            drain.unwatch(scope)
            if keys is not None and key:
                key_status = keys.unwatch(key, scope)
        # Decided here, before any final event: a cancel that came first wins even when the
        # generation ended on its own meanwhile, since the cancel endpoint answered CANCELLED; one
        # after this answers 409 (edge/cancel/live.py). A cancel sent to another edge instance is
        # learnt from the settle's answer: the store decides between it and this end in one
        # script (edge/cancel/bus.py), so the stream's end costs no round trip of its own.
        cancelled_here = self._live.end()
        if cancelled_here:
            # The cancel came first: its reply (what was generated, marked cancelled) is the answer.
            self._answered_nothing = False
        elif scope.cancelled_caught and key_status is not None and not self._req.stream:
            # Cut by its key, not streamed: the client gets the 401 alone, which costs it nothing.
            self._answered_nothing = True
        # Given back before the final events too (the keep-alive stopped: nothing else may write to
        # the stream then): a client that sees the end may start its next stream at once.
        cancelled_elsewhere = await self._give_back()
        # A cancel another edge took is learnt only from the settle: a request refunded as answered
        # with its error alone keeps that error (its text, turned into a cancelled reply, was free).
        if cancelled_here or (cancelled_elsewhere and self._charged):
            out.reason = "cancelled"
            out.marker = CANCELLED_MARKER
            out.error = None
        elif scope.cancelled_caught and key_status is not None:
            # Its key was revoked or expired meanwhile: the stream ends with the 401 a new request
            # with the key gets, given back and settled like a cancel.
            log.info(
                "stream_ended_for_key",
                request_id=self.request_id,
                key_id=self._principal.key_id,
                key_status=key_status,
            )
            out.reason = "key_inactive"
            out.error = refusal(key_status)
        elif scope.cancelled_caught and drain.past_deadline:
            out.reason = "drained"
            out.error = shutting_down_error(self._p.drain.accept_left_s())

    async def _place_and_relay(self, out: Outcome, on_text: TextSink) -> None:
        """Get a slot and relay; a replica that fails before the first token is retried once elsewhere."""
        failed: frozenset[str] = frozenset()
        include_stop = self._req.include_stop_str_in_output
        while True:
            try:
                self._slot = await self._p.dispatcher.acquire(self._ticket, failed)
            except Overloaded:
                if failed:
                    raise UpstreamError(f"no other replica after {sorted(failed)} failed") from None
                raise
            metrics.REQUESTS_RUNNING.inc()
            out.upstream = self._slot.upstream.name
            slot = self._slot
            relay = TokenRelay(
                out,
                on_text,
                # A client's stop_token_ids end the reply, their text left out (edge/text/detokenizer.py)
                # unless it asks for it, as vLLM's include_stop_str_in_output keeps a stop string too.
                self._p.text.detokenizer(None if include_stop else self._req.stop_token_ids),
                StopMatcher(self._req.stop_strings, self._upstream_req.min_tokens, include_stop),
                self._lease,
                slot.grow,
                self._arrived,
                self._stop_keepalive,
            )
            # An upstream that can hand each delta to the relay in its own callback
            # (edge/upstreams/direct.py) spares a token the wake-up of this task when nothing waits.
            direct: GenerateDirect | None = getattr(slot.upstream, "generate_direct", None)
            if direct is not None:
                self._deltas = direct(self._upstream_req, relay.offer)
            else:
                self._deltas = slot.upstream.generate(self._upstream_req)
            if not self._reached_replica:
                self._reached_replica = True
                self._record_prompt()
            try:
                await relay.run(self._deltas)
                return
            except UpstreamError as exc:
                if out.ttft_s is not None or failed:
                    raise
                # The error that made this replica suspect; the request goes on to another one.
                log.warning("upstream_failover", upstream=out.upstream, error=str(exc))
                failed = frozenset({out.upstream})
                await self._give_back_slot(failed=True)

    async def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            keepalive, self._keepalive = self._keepalive, None
            await keepalive.stop()

    async def _give_back(self) -> bool | None:
        """The keep-alive stopped, the replica's slot and the lease given back (the first call
        does it all; shielded: a disconnect must not leave a slot held). The settle's answer:
        True when the store says a cancel sent to another instance came first (OutputLease.settle)."""
        with cancel_scope(shield=True):
            await self._stop_keepalive()
            await self._give_back_slot()
            # A request not charged (_charged) gets its prompt's tokens and the request back.
            settle = self._lease.settle(ran=self._charged)
            cancelled_elsewhere = await _quietly(settle, "lease_settle_failed", self.request_id)
        return cancelled_elsewhere

    async def _give_back_slot(self, *, failed: bool = False) -> None:
        deltas, self._deltas = self._deltas, None
        if deltas is not None:
            # Closing the stream is what aborts the sequence on the replica and frees its KV blocks.
            await _quietly(aclose_stream(deltas), "upstream_close_failed", self.request_id)
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release(failed=failed)
            metrics.REQUESTS_RUNNING.dec()

    async def close(self, out: Outcome | None = None) -> None:
        """Give back everything the request holds. Idempotent; safe when it never ran."""
        if self._closed:
            return
        self._closed = True
        out = out or Outcome()
        await self._give_back()
        self._p.registry.finish(self._live)
        self._record(out)

    def _record_prompt(self) -> None:
        """A named conversation's question, stored once the request reaches a replica: a request
        turned away before (a 429 from the queue, a cancel while queued) has no answer, and a
        client retrying it, as the 429 says to, would find its question twice. Stored now rather
        than with the reply, so that an edge dying mid-stream still leaves the question."""
        conversation_id = self._req.conversation_id
        final = self._req.messages[-1]
        # Only a request ending on the user's message asks something new: one that continues an
        # assistant's message (continue_final_message), or holds a system prompt alone, would store
        # an earlier question again, or an empty one.
        if conversation_id is not None and self._p.messages is not None and final.role == "user":
            self._p.messages.record_prompt(
                conversation_id, self._principal.user, self.request_id, final.text()
            )

    def _record(self, out: Outcome) -> None:
        tier = self._principal.tier
        model = self._p.dispatcher.model
        child(metrics.GENERATION_TOKENS, model, tier).inc(out.completion_tokens)
        child(metrics.REQUESTS_FINISHED, model, tier, out.reason).inc()
        if out.ttft_s is not None:
            child(metrics.TTFT, model, tier).observe(out.ttft_s)
        info_line(
            log,
            "chat_completion",
            {
                "request_id": self.request_id,
                "user": self._principal.user,
                "tier": tier,
                "model": self._p.config.model_name,
                "stream": bool(self._req.stream),
                "outcome": out.reason,
                "upstream": out.upstream,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": out.completion_tokens,
                "cached_tokens": out.cached_tokens,
                "ttft_ms": None if out.ttft_s is None else round(out.ttft_s * 1000, 2),
                "duration_ms": round((time.perf_counter() - self._arrived) * 1000, 2),
            },
        )
        if self._p.usage is not None and self._charged:
            # Exactly what the lease settled as charged: the prompt and every granted token (a
            # request not charged was refunded whole, and costs nothing).
            self._p.usage.record(
                self._principal.user, self._p.config.model_name, self.prompt_tokens, out.completion_tokens
            )
        conversation_id = self._req.conversation_id
        if conversation_id is not None and self._p.messages is not None and self._reached_replica:
            reply = "".join(out.text)
            if self._req.prompt_end == "continue":
                # The client began the reply: the stored turn is the whole of it, not its end alone.
                reply = self._req.messages[-1].text() + reply
            self._p.messages.record_reply(
                conversation_id, self._principal.user, self.request_id, reply, _stored_finish_reason(out)
            )


def _stored_finish_reason(out: Outcome) -> str:
    """The API's finish_reason, or what cut the reply short (the history tells a partial reply apart)."""
    if out.reason in ("cancelled", "error", "rejected", "disconnected", "drained", "key_inactive"):
        return out.reason
    return out.finish_reason


async def _quietly(step: Awaitable[_T], what: str, request_id: str) -> _T | None:
    # Clean-up steps must all run: one failing (a store hiccup) is logged, not raised.
    try:
        return await step
    except Exception as exc:
        log.warning(what, request_id=request_id, error=repr(exc))
        return None

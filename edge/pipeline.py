"""One chat completion's admission, read top to bottom: everything decided before the response
starts, where a refusal is a plain HTTP status.

Count the prompt's tokens (a long prompt waits for an encode thread within its tier's max wait;
after the request's own checks: its model, its sampling parameters against the vocabulary,
max_tokens against its tier and the model's context) → hold its named conversation, if any
(edge/messages/conversation_lock.py) → ask the limiter → ask the admission queue whether waiting
makes sense. What is admitted is a Generation (generation.py),
which runs it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import structlog

from edge import metrics
from edge.admission.cache_scope import PrefixCacheScope, cache_salt
from edge.admission.dispatcher import Dispatcher
from edge.admission.prefix_index import routing_hashes
from edge.admission.ticket import NeverFits, Overloaded, Ticket
from edge.binding_limit import cache_refusal_past_the_context
from edge.cancel.registry import RequestRegistry
from edge.config import TierConfig
from edge.disconnect_watch import DisconnectWatch
from edge.drain import Drain
from edge.errors import (
    ApiError,
    conversation_locked,
    invalid_request,
    limiter_unavailable,
    never_fits_error,
    overloaded_error,
    wait_text,
)
from edge.generation import Generation
from edge.keys.principal import Principal
from edge.keys.stream_watch import StreamWatch
from edge.log_line import refusal_line
from edge.messages.conversation_lock import ConversationLocked, ConversationLocks, HeldLock
from edge.metric_children import child
from edge.models.token_weight import weighted
from edge.prompt_encoding import encode_messages
from edge.request_ids import new_request_id
from edge.schemas import ChatCompletionRequest, ChatMessage, unknown_model, unknown_tier
from edge.stream_gate import StreamGate
from edge.text.chat_template import ChatTemplateError
from edge.text.model_text import ModelText
from edge.upstreams.base import GenerationRequest
from limiter.base import Limiter, StoreUnavailable
from limiter.headers import ratelimit_headers, refunded_headers
from limiter.tiers import per_instance

log = structlog.get_logger("floodgate.request")


class UsageSink(Protocol):
    """Where a settled request's charged tokens go (the usage writer): must not wait."""

    def record(
        self,
        user: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        input_cached_tokens: int,
        *,
        arrived_s: float | None = None,
    ) -> bool: ...


class MessageSink(Protocol):
    """Where a named conversation's turn goes (the message writer): the prompt when the request
    sends its first text, the reply when it ends."""

    def record_prompt(
        self,
        conversation_id: str,
        user: str,
        request_id: str,
        prompt: str,
        name: str | None = None,
        *,
        after: str | None = None,
    ) -> str:
        """The turn's id: made greater than `after`, the conversation's newest."""
        ...

    def record_reply(
        self,
        conversation_id: str,
        user: str,
        request_id: str,
        reply: str,
        finish_reason: str,
        model: str,
        *,
        after: str | None = None,
    ) -> str:
        """The turn's id: made greater than `after`, the conversation's newest."""
        ...


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
    # What every tier's limits are divided by where this edge enforces them alone: the in-process
    # limiter's [limiter] instance_count (limiter/tiers.py per_instance); 1 with the shared one.
    limits_divisor: int = 1


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
        gate: StreamGate | None = None,
        locks: ConversationLocks | None = None,
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
        # The door in front of generations (edge/stream_gate.py): it keeps the paid share of the
        # process's streams once a request is known to be good and whose it is.
        self.gate = gate
        # One request at a time per named conversation; None: not held (tests without a store).
        self.locks = locks

    async def admit(
        self,
        principal: Principal,
        req: ChatCompletionRequest,
        watch: DisconnectWatch | None = None,
        *,
        retry: bool = False,
    ) -> Generation:
        """Everything decided before the response starts; raises ApiError for a 4xx/5xx answer.
        `watch`: the client's connection (edge/disconnect_watch.py), whose going abandons the wait
        for an encode thread (edge/hang_up.py); None where the server has none. `retry`: the client
        says it sends this request again (edge/retry_count.py)."""
        arrived = time.perf_counter()
        tier = self.config.tiers.get(principal.tier)
        if tier is None:
            raise unknown_tier(principal.tier)
        if req.model and req.model != self.config.model_name:  # none or empty: the tier's default
            raise unknown_model(req.model)
        logit_bias = self._logit_bias(req)
        stop_token_ids = self._stop_token_ids(req)
        messages = [_template_message(m) for m in req.messages]
        salt = cache_salt(principal.user, self.config.prefix_cache_scope)
        try:
            prompt_ids, encode_wait_s = await encode_messages(
                self.text.encode_chat,
                messages,
                salt,
                req.prompt_end,
                tier.priority,
                tier.max_queue_wait_s,
                # The one wait before the limiter: a client that leaves during it is let go at
                # once (a 499), its prompt not encoded, the limiter never asked.
                watch,
                principal.user,
            )
        except ChatTemplateError as exc:
            raise invalid_request(f"The chat template rejected these messages: {exc}", "messages") from None
        except Overloaded as exc:
            # Waited its tier's max wait for an encode thread (edge/encode_queue.py): before the
            # limiter and the stream gate, so it is charged nothing and holds no place there.
            raise self._refused(principal, new_request_id(), overloaded_error(exc)) from None
        # The model's context first: a client that trims its history on context_length_exceeded
        # must get that code for a prompt too long for both.
        max_new = self._max_new_tokens(req, tier, len(prompt_ids))
        counted = weighted(len(prompt_ids), self.config.token_weight)
        # The budget this edge enforces: with the in-process limiter on N edges, its share of the
        # tier's. A prompt the tier holds but the share does not was admitted, charged the whole
        # share, and answered 200 with no text and the budget's marker, on every edge, every time.
        divisor = self.config.limits_divisor
        budget = tier.tokens_per_window if divisor == 1 else per_instance(tier, divisor).tokens_per_window
        if counted + weighted(1, self.config.token_weight) > budget:
            # No wait would ever admit it with room for a reply (one token, as this model counts it):
            # say so now instead of a 429 whose Retry-After lies, or a 200 that spends the whole
            # budget on an empty reply. On a weighted model, what it counts as: the budget is in
            # weighted tokens.
            weight = self.config.token_weight
            as_counted = (
                "" if counted == len(prompt_ids) else f", {counted} tokens at this model's weight {weight:g}"
            )
            whole = f"{tier.tokens_per_window} tokens per {tier.token_window_s:g}s"
            where = (
                f"your tier's whole token budget ({whole})"
                if divisor == 1
                else f"the share of your tier's token budget this server enforces ({budget} of {whole})"
            )
            raise invalid_request(
                f"The messages are {len(prompt_ids)} tokens{as_counted}, which leaves no room for a "
                f"reply in {where}. Please shorten them.",
                "messages",
                code="tokens_exceed_budget",
            )
        min_tokens = self._min_tokens(req, max_new)

        request_id = new_request_id()
        # Bound for the rest of this request's task: every log line it causes carries the id, and
        # whose request it is (a replica's failure, a failover, a stalled reader's cut named the id
        # alone, and an operator looking into one user's or tier's errors had to join each line
        # to the request's own).
        structlog.contextvars.bind_contextvars(
            request_id=request_id, user=principal.user, tier=principal.tier
        )
        ticket = Ticket(
            request_id=request_id,
            user=principal.user,
            priority=tier.priority,
            kv_tokens=len(prompt_ids) + max_new,
            # One bound for the request's whole wait: the tier's max wait, less what it waited for
            # an encode thread (else a long prompt could wait it twice before a replica took it).
            max_wait_s=max(0.0, tier.max_queue_wait_s - encode_wait_s),
            # Tiers above the lowest priority are the paying ones: only they may use the reserve.
            may_use_reserve=tier.may_use_reserve,
            tier=principal.tier,
            prefix_keys=routing_hashes(prompt_ids, salt),
            prompt_tokens=len(prompt_ids),
            retry=retry,
        )
        try:
            # Before the limiter: a request no replica could ever hold costs the user nothing.
            self.dispatcher.check_fits(ticket)
        except NeverFits as exc:
            raise self._refused(principal, request_id, never_fits_error(exc)) from None
        if self.gate is not None:
            # After the never-fits check (a 400, 0.35 µs): a request no replica could ever hold, told
            # server_busy while the free share was full, was retried for good. Both come before the
            # limiter, the expensive step the door's free share keeps the paid share from.
            self.gate.hold_reserve(tier.may_use_reserve)
        # Held from here to the request's end (Generation.close): before the limiter, so a request
        # refused for it costs the user nothing; given back here if the request goes no further.
        lock = (
            None if req.conversation_id is None else await self._hold_conversation(principal, req, request_id)
        )
        try:
            try:
                admission = await self.limiter.admit(
                    principal.user,
                    request_id,
                    tier,
                    len(prompt_ids),
                    max_new,
                    # Named, the reply asked for; else the user's usual reply, not the tier's largest
                    # (a free user told 37 minutes) nor a first lease (a client that waited got 32).
                    asked_output_tokens=(
                        max_new
                        if req.requested_max_tokens is not None
                        else self.dispatcher.typical_reply_tokens(principal.user, max_new)
                    ),
                )
            except StoreUnavailable as exc:
                raise self._refused(principal, request_id, limiter_unavailable(exc.retry_after_s)) from None
            decision = admission.decision
            if not decision.allowed or admission.lease is None:
                limit = decision.limit or "requests"
                child(metrics.RATE_LIMITED, self.dispatcher.model, principal.tier, limit).inc()
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
                        headers=ratelimit_headers(decision),
                    ),
                )
            try:
                self.dispatcher.precheck(ticket)
            except Overloaded as exc:
                await admission.lease.settle(ran=False)
                refunded = refunded_headers(decision, admission.lease.charged)
                raise self._refused(principal, request_id, overloaded_error(exc, refunded)) from None
        except BaseException:
            if lock is not None:
                await lock.release()
            raise
        headers = ratelimit_headers(decision)
        temperature = self.config.default_temperature if req.temperature is None else req.temperature
        upstream_req = GenerationRequest(
            request_id=request_id,
            prompt_ids=prompt_ids,
            max_new_tokens=max_new,
            # top_p 0 is greedy decoding, and asked for as such (schemas.py, greedy_by_top_p).
            temperature=0.0 if req.greedy_by_top_p else temperature,
            top_p=self.config.default_top_p if req.replica_top_p is None else req.replica_top_p,
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
            decision,
            {**headers, "x-request-id": request_id},
            arrived,
            lock,
        )

    async def _hold_conversation(
        self, principal: Principal, req: ChatCompletionRequest, request_id: str
    ) -> HeldLock | None:
        """The request's named conversation held for it, or the 400 `conversation_locked` that
        OpenAI's Responses API answers a second request on a conversation in use (its words, its
        type and code; the param is this API's). None without a conversation (no store round trip)
        or where the store could not be asked (conversation_lock.py)."""
        if req.conversation_id is None or self.locks is None:  # the caller checks the first inline
            return None
        try:
            return await self.locks.take(principal.user, req.conversation_id, request_id)
        except ConversationLocked:
            raise self._refused(principal, request_id, conversation_locked()) from None

    def _refused(self, principal: Principal, request_id: str, error: ApiError) -> ApiError:
        """A refusal after the request got its id (the limiter's 429 or 503, the queue's): the id
        travels in `x-request-id`, as on an admitted request's response, and one log line carries
        it, so a client quoting the id of a 429 it was given can be found in the logs."""
        error.headers["x-request-id"] = request_id
        fields = {
            "request_id": request_id,
            "user": principal.user,
            "tier": principal.tier,
            "model": self.config.model_name,
            "status": error.status,
            "code": error.detail.code,
        }
        refusal_line(log, "chat_refused", fields)
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

    @property
    def max_model_len(self) -> int:
        """The model's context: the settings' (edge/app.py _max_model_len), within the smallest a
        replica reports holding (a Triton replica's engine build, which the settings only guess:
        past it TensorRT-LLM ends a reply short, unasked, as if it had finished)."""
        own = self.config.max_model_len
        reported = self.dispatcher.max_sequence_tokens
        return min(own, reported) if reported else own

    def _max_new_tokens(self, req: ChatCompletionRequest, tier: TierConfig, prompt_tokens: int) -> int:
        asked = req.requested_max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        context = self.max_model_len
        room = context - prompt_tokens
        if room < 1:
            # A prompt the context cannot hold whatever the completion: the client must trim its
            # messages, which only this code tells it, even when max_tokens is over its tier too.
            raise self._context_exceeded(context, prompt_tokens, asked or 1)
        if asked is not None and asked > tier.max_tokens:
            raise invalid_request(
                f"{param} is too large: {asked}. Your tier allows at most {tier.max_tokens}.", param
            )
        max_new = asked if asked is not None else min(tier.max_tokens, room)
        if max_new > room:
            cache = cache_refusal_past_the_context(self.dispatcher, tier, prompt_tokens, room, max_new)
            raise cache or self._context_exceeded(context, prompt_tokens, max_new)
        return max_new

    @staticmethod
    def _context_exceeded(context: int, prompt_tokens: int, completion_tokens: int) -> ApiError:
        return invalid_request(
            f"This model's maximum context length is {context} tokens. However, you "
            f"requested {prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, "
            f"{completion_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            "messages",
            code="context_length_exceeded",
        )


def _template_message(message: ChatMessage) -> dict[str, str]:
    """A message as the chat template reads it. OpenAI's `developer` role is its newer name for
    `system` (what it says for o1 and later); chat templates know only `system`, and SmolLM2's would
    add its own default system prompt in front of a `developer` turn it renders as a turn of its
    own. The message's `name` goes with it where it has one, as vLLM passes the whole message: a
    template may write who spoke (or a function message's function), and one that does not read it
    renders as before."""
    role = "system" if message.role == "developer" else message.role
    out = {"role": role, "content": message.text()}
    if message.name is not None:
        out["name"] = message.name
    return out

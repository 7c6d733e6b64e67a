"""One admitted chat completion, run once: as a stream or as one answer.

With the stream open: first event (it carries the request id) → wait for a replica slot, sending
keep-alive comments → relay the replica's token ids as text, charging each token to the limiter's
lease → final chunk → usage chunk → [DONE]. Whatever happens, the `finally` settles the lease,
releases the slot, records the metrics and logs one line.

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
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import structlog

from edge import metrics
from edge.admission.slot import Slot
from edge.admission.ticket import NeverFits, Overloaded, Ticket
from edge.admission.wait_estimate import MIN_RETRY_S
from edge.cancel.live import LiveRequest
from edge.cancel.scope import cancel_scope
from edge.cancel.stream_close import aclose_stream
from edge.errors import (
    ApiError,
    in_stream,
    internal_error,
    invalid_request,
    limiter_unavailable,
    never_fits_error,
    overloaded_error,
    shutting_down_error,
    upstream_error,
)
from edge.keys.authenticator import refusal
from edge.keys.principal import Principal
from edge.log_line import info_line
from edge.messages.conversation_lock import HeldLock
from edge.metric_children import child
from edge.schemas import ChatCompletionRequest, ChatMessage
from edge.sse import DONE, KEEPALIVE, ChunkEncoder, event, usage_dict
from edge.text.stops import StopMatcher
from edge.token_relay import TOKENS_LIMIT_MARKER, TextSink, TokenRelay
from edge.upstreams.base import (
    ContextLengthExceeded,
    Delta,
    GenerationRequest,
    ReplicaRestarting,
    RequestRejected,
    UpstreamError,
)
from edge.upstreams.direct import GenerateDirect
from limiter.base import Decision, OutputLease, StoreUnavailable
from limiter.headers import refunded_headers, settled_headers

if TYPE_CHECKING:
    from edge.pipeline import Pipeline

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
    "limiter_unavailable",
]

CANCELLED_MARKER: dict[str, Any] = {"cancelled": True}


@dataclass(slots=True)
class Outcome:
    """How one admitted request went, filled in as it runs."""

    reason: EndReason = "error"  # until something better is known
    marker: dict[str, Any] | None = None
    completion_tokens: int = 0
    # Prompt tokens the replica served from its prefix cache (Delta.cached_tokens).
    cached_tokens: int = 0
    text: list[str] = field(default_factory=list)
    # Text of the reply's last delta, written with the closing events in one write (`stream`), or
    # of a reply cut or failed, what the relay counted and had not written (edge/token_relay.py).
    held: list[str] = field(default_factory=list)
    error: ApiError | None = None  # a failure after admission: an error event, or the status
    upstream: str = ""
    ttft_s: float | None = None
    # Text the relay counted and charged whose write a cut stopped before it was done: kept already
    # (`text`), it goes out with the closing events, before `held` (edge/token_relay.py).
    unwritten: str = ""
    # Some of the reply's text went to the client (a stream's `on_text`).
    sent_text: bool = False

    @property
    def got_text(self) -> bool:
        """The client gets some of the reply's text: sent, or going out with the closing events. A
        stream that ends with an error and none is answered with the error alone: refunded whole,
        nothing of it stored, as a request not streamed is (its first tokens may carry no text: a
        character's first bytes, a stop string's start; a review)."""
        return self.sent_text or bool(self.held) or bool(self.unwritten)

    @property
    def finish_reason(self) -> str:
        return "length" if self.reason == "length" else "stop"


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
        decision: Decision,
        headers: dict[str, str],
        arrived: float,
        conversation_lock: HeldLock | None = None,
    ) -> None:
        self._p = pipeline
        self._principal = principal
        self._req = req
        self._upstream_req = upstream_req
        self._ticket = ticket
        self._lease = lease
        # What the admission charged, which its decision's headers count (`_settled_headers`).
        self._admitted_charge = lease.charged
        self._decision = decision
        self.headers = headers
        self._arrived = arrived
        # The named conversation, held for this request from its admission to its close.
        self._conversation_lock = conversation_lock
        self.request_id = upstream_req.request_id
        self.created = int(time.time())
        self._live: LiveRequest = pipeline.registry.register(self.request_id, principal.user)
        self._slot: Slot | None = None
        self._deltas: AsyncIterator[Delta] | None = None
        self._keepalive: _KeepAlive | None = None
        # On a replica now: charged unless answered with an error alone. A first attempt that failed
        # before its first token undoes it: waiting for another try costs what waiting in the
        # queue does, nothing, until a replica takes the request again.
        self._reached_replica = False
        # A named conversation's question is stored (_record_prompt): its reply will be too.
        self._prompt_recorded = False
        # The request was on a replica that died again soon after a crash: it may be what killed
        # it (ReplicaRestarting.may_be_cause). It goes to no replica it was on again, and its 502
        # does not invite the client to send it again.
        self._maybe_poison = False
        # The replica refused the request, or failed before the client got any of its text: the
        # client got only an error, and is charged nothing for it (OpenAI bills no 4xx or 5xx).
        self._answered_nothing = False
        self._closed = False
        # Everything given back (_give_back ran to its end): the close's call is then a no-op.
        self._given_back = False
        # The closing events of a stream the server's exit cut (`stream`): edge/streaming.py writes
        # them, the generation's task being cancelled by then. None until such a cut.
        self.exit_words: bytes | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self._upstream_req.prompt_ids)

    @property
    def _charged(self) -> bool:
        """Whether the user pays for the request: it reached a replica and got an answer (a request
        turned away, cancelled while queued, or answered with an error alone costs it nothing)."""
        return self._reached_replica and not self._answered_nothing

    def _billed(self, out: Outcome) -> tuple[int, int, int]:
        """The usage object's counts: what the user is charged, as the budget and /v1/usage count
        it. A request that cost nothing (cancelled while queued, or while the engine it waited
        for restarted) said its prompt's tokens there, and a client billing its own users by
        `usage` counted them."""
        if not self._charged:
            return 0, 0, 0
        return self.prompt_tokens, out.completion_tokens, out.cached_tokens

    async def stream(
        self,
        emit: Emit,
        end: Emit,
        write_now: Callable[[bytes], bool] | None = None,
        exiting: Callable[[], bool] | None = None,
    ) -> None:
        """Write the events with `emit`; the last ones with `end`, which also ends the response.
        `write_now`, where the server offers it (edge/body_chunks.py), writes a token's event at once
        when nothing would make it wait: no coroutine and no ASGI send for that token. `exiting`
        tells a cancel by the server's exit from a client's hang-up (edge/streaming.py)."""
        enc = ChunkEncoder(
            self.request_id, self._p.config.model_name, self.created, self._req.answered_service_tier
        )
        out = Outcome()
        keep_text = self._req.conversation_id is not None

        def on_text(text: str) -> Awaitable[None] | None:
            out.sent_text = True
            if keep_text:
                if not self._prompt_recorded:
                    # A named conversation's question, stored with the reply's first text.
                    self._prompt_recorded = True
                    self._record_prompt()
                out.text.append(text)
            chunk = enc.delta(text)
            if write_now is not None and write_now(chunk):
                return None
            return emit(chunk)

        try:
            await emit(enc.first())
            await self._run(out, on_text, emit)
            closing = self._closing(enc, out)
        except anyio.get_cancelled_exc_class():
            if exiting is None or not exiting():
                out.reason = "disconnected"
                raise
            # Cut by the server's exit: the request ends as the drain's cut does, in its log line and
            # its metrics too (logged `disconnected`, an exit read as the user's leaving), and so does
            # the stream, which edge/streaming.py ends with these events: the text held back and the
            # usage chunk went missing there, though charged (a client billing by `usage` missed
            # them). Before any text, refunded whole (`_run`): charged its prompt, it was charged
            # again for the retry the error event invites (floodgate_client's auto_retry).
            out.reason = "drained"
            out.error = shutting_down_error()
            if not out.got_text:
                self._answered_nothing = True
            self.exit_words = self._closing(enc, out)
            raise
        finally:
            await self.close(out)
        # Closed first: when the client sees the stream end, the lease is settled, the slot free and
        # the request logged. Then the last text, the closing events and the end of the body go out
        # in one write (one syscall, not five): all were ready at once, so none waited for another.
        await end(closing)

    def _closing(self, enc: ChunkEncoder, out: Outcome) -> bytes:
        """A stream's last events, once its outcome is known: the text held back, the final chunk or
        the error event, the usage chunk where asked for, [DONE]. Made before the close, which
        stores a named conversation's reply, the held text in it."""
        closing: list[bytes] = []
        if out.held or out.unwritten:
            text = "".join(out.held)
            closing.append(enc.delta(out.unwritten + text))
            if self._req.conversation_id is not None:
                out.text.append(text)
        usage = [enc.usage(*self._billed(out))] if self._req.include_usage else []
        if out.error is not None:
            # Ended by an error (a replica failed mid-stream, a shutdown or its key cut it):
            # the tokens it got were charged, and a client billing by `usage` must see them.
            # Before the error event: the SDKs raise at it and read nothing after.
            closing += usage
            closing.append(event({"error": in_stream(out.error)}))
        else:
            closing.append(enc.final(out.finish_reason, out.marker))
            closing += usage
        closing.append(DONE)
        return b"".join(closing)

    async def complete(self, exiting: Callable[[], bool] | None = None) -> dict[str, Any]:
        """The answer's body, or the ApiError that answers it instead. `exiting` tells a cancel by
        the server's exit from a client's hang-up (edge/routes/chat.py)."""
        out = Outcome()

        try:
            await self._run(out, out.text.append, None)
            out.text += out.held
        except anyio.get_cancelled_exc_class():
            if exiting is None or not exiting():
                out.reason = "disconnected"
                raise
            # Cut by the server's exit, its client still there: answered as the drain's cut is, a
            # 503 that another instance takes the retry of, refunded whole. The cancel ends here,
            # as a stream's does (edge/streaming.py), for the answer to go out; uvicorn's bare 500
            # (text, no Retry-After) answered it, charged its prompt, and the retry paid it again.
            out.reason = "drained"
            out.error = shutting_down_error()
            self._answered_nothing = True
        finally:
            await self.close(out)
        # Sent once the request is settled, its headers say the budget it left: refunded whole
        # (answered with the error alone), or charged the reply it got.
        headers = self._settled_headers() if self._charged else self._refunded_headers()
        if out.error is not None:
            out.error.headers = {**headers, **out.error.headers}
            out.error.finished = True  # counted by `close`: not a refusal as well
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
            "usage": usage_dict(*self._billed(out)),
        }
        if (tier := self._req.answered_service_tier) is not None:
            body["service_tier"] = tier
        if out.marker:
            body["floodgate"] = out.marker
        self.headers = headers  # what the route answers with the body (edge/routes/chat.py)
        return body

    def _refunded_headers(self) -> dict[str, str]:
        return {**self.headers, **refunded_headers(self._decision, self._lease.charged)}

    def _settled_headers(self) -> dict[str, str]:
        """A settled request's, charged what its reply used: the decision's said the admission's
        charge alone (its prompt and a first lease), and a reply the budget cut was answered with
        tokens remaining (tests/faults/test_settled_rate_limit_headers.py)."""
        extra = self._lease.charged - self._admitted_charge
        return {**self.headers, **settled_headers(self._decision, extra)}

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
        except NeverFits as exc:
            # The replicas changed while it waited and none could hold it now: the 400 a new
            # request gets (Pipeline.admit), not a 503 whose retry alone said so.
            out.reason = "rejected"
            out.error = never_fits_error(exc)
        except RequestRejected as exc:
            # The request's own fault: a 400 for it alone, and the replica is not blamed.
            log.info("request_rejected_by_replica", request_id=self.request_id, error=str(exc))
            if self._slot is not None:
                self._slot.discard()  # no failure mark, no service-rate sample
            out.reason = "rejected"
            message = f"The model replica refused this request: {exc}"
            if isinstance(exc, ContextLengthExceeded):
                out.error = invalid_request(message, "messages", code="context_length_exceeded")
            else:
                out.error = invalid_request(message, None)
            self._answered_nothing = True
        except StoreUnavailable as exc:
            # A fail-closed tier's store stopped answering mid-stream: nothing vouches for more of
            # the user's tokens. Streamed, what came was charged; not streamed, the client gets
            # the 503 alone, which costs it nothing.
            log.warning("limiter_unavailable_midstream", request_id=self.request_id)
            out.reason = "limiter_unavailable"
            out.error = limiter_unavailable(exc.retry_after_s)
            self._answered_nothing = not self._req.stream or not out.got_text
        except UpstreamError as exc:
            log.warning("upstream_failed", request_id=self.request_id, upstream=out.upstream, error=str(exc))
            out.reason = "error"
            if self._maybe_poison:
                # Without Retry-After and final for the OpenAI SDK: its retries, sent when the new
                # child serves (or, without the header, waiting in the queue for it), met it with
                # the request that may kill it again.
                out.error = upstream_error(None, final=True)
            else:
                out.error = upstream_error(_retry_after_s(exc))
            # Streamed, the tokens before the failure reached the client; not, it gets the error alone.
            self._answered_nothing = not self._req.stream or not out.got_text
        except Exception as exc:
            # The edge's own failure (a bug, a store's unmapped error): the request still ends as
            # a failed one does, settled, its text and usage chunk sent before the error event.
            # It ended with the error event alone, the usage the client asked for missing (its
            # tokens charged all the same), and not streamed, a 500 charged what it never saw.
            log.error("generation_failed", request_id=self.request_id, upstream=out.upstream, exc_info=exc)
            out.reason = "error"
            out.error = internal_error()
            self._answered_nothing = not self._req.stream or not out.got_text
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
        elif (
            scope.cancelled_caught
            and (not self._req.stream or not out.got_text)
            and (key_status is not None or drain.past_deadline)
        ):
            # Cut by its key or the drain's deadline, not streamed or before any text: the client
            # gets the 401 or the 503 alone, which costs it nothing (a client retrying the 503, as
            # it invites, would otherwise pay twice; a stream cut during its prefill was charged
            # its prompt, a review).
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
            out.error = shutting_down_error()

    async def _place_and_relay(self, out: Outcome, on_text: TextSink) -> None:
        """Get a slot and relay; a replica that fails before the first token is retried once
        elsewhere, or, where it failed by dying and is being restarted (ReplicaRestarting), on
        whichever replica takes the request first, itself once back included: with one engine, its
        crash is then a wait for the request that met it, not a 502. Not where the request may be
        what killed it (`may_be_cause`: it was on a child that died within a minute of replacing a
        dead one): a request that crashes the engine crashed each new child it was sent back to;
        that one goes elsewhere or fails, as vLLM's server fails the requests its dead engine held."""
        failed: frozenset[str] = frozenset()
        retried = False
        include_stop = self._req.include_stop_str_in_output
        while True:
            try:
                self._slot = await self._p.dispatcher.acquire(self._ticket, failed)
            except Overloaded as exc:
                if retried:
                    raise _NotRetried(
                        f"no replica took the request again after {out.upstream} failed ({exc.reason})",
                        exc.retry_after_s,
                    ) from None
                raise
            metrics.REQUESTS_RUNNING.inc()
            out.upstream = self._slot.upstream.name
            slot = self._slot
            relay = TokenRelay(
                out,
                on_text,
                # A client's stop_token_ids end the reply, their text left out (edge/text/detokenizer.py)
                # unless it asks for it, as vLLM's include_stop_str_in_output keeps a stop string too.
                # A continued message's reply is decoded after the prompt it continues: its first
                # word keeps the space before it (edge/text/detokenizer.py).
                self._p.text.detokenizer(
                    None if include_stop else self._req.stop_token_ids,
                    self._upstream_req.prompt_ids if self._req.prompt_end == "continue" else (),
                ),
                StopMatcher(self._req.stop_strings, self._upstream_req.min_tokens, include_stop),
                self._lease,
                slot.grow,
                self._arrived,
                self._stop_keepalive,
                child(metrics.INTER_TOKEN, self._p.dispatcher.model).observe,
            )
            # An upstream that can hand each delta to the relay in its own callback
            # (edge/upstreams/direct.py) spares a token the wake-up of this task when nothing waits.
            direct: GenerateDirect | None = getattr(slot.upstream, "generate_direct", None)
            if direct is not None:
                self._deltas = direct(self._upstream_req, relay.offer)
            else:
                self._deltas = slot.upstream.generate(self._upstream_req)
            self._reached_replica = True
            try:
                await relay.run(self._deltas)
                if slot.first_token_at is None:
                    # Ended as replies end with no token (TensorRT-LLM leaves out an end token that
                    # came first): a generation that ran all the same, its reply 0 tokens long.
                    slot.grow(0)
                if out.marker is None:
                    # Its own end (a stop, its max_tokens), not the token budget's (the marker):
                    # its length is what the user's replies run to (admission/slot.py).
                    slot.mark_finished()
                return
            except Exception as caught:
                failure = _as_upstream_error(caught, self._deltas)
                if isinstance(failure, ReplicaRestarting) and failure.may_be_cause:
                    self._maybe_poison = True
                if out.ttft_s is not None or retried:
                    # No other try: the replica failed it all the same (mid-stream, or the retry's
                    # before its first token), suspect until its next check passes, and no
                    # generation that ran (a service time, the user's usual reply length).
                    await self._give_back_slot(failed=True)
                    if failure is caught:
                        raise
                    raise failure from caught
                retried = True
                # The error that made this replica suspect; the request goes on to another one, or
                # waits for this one where it is coming back and cannot have been killed by it.
                waits = isinstance(failure, ReplicaRestarting) and not failure.may_be_cause
                log.warning(
                    "upstream_failover",
                    upstream=out.upstream,
                    error=str(failure),
                    waits_for_restart=waits,
                    may_be_cause=self._maybe_poison,
                )
                if not waits:
                    failed = frozenset({out.upstream})
                await self._give_back_slot(failed=True)
                # Nothing of it reached the client: until a replica takes it again it is a queued
                # request, which a disconnect or a cancel leaves uncharged.
                self._reached_replica = False

    async def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            keepalive, self._keepalive = self._keepalive, None
            await keepalive.stop()

    async def _give_back(self) -> bool | None:
        """The keep-alive stopped, the replica's slot and the lease given back (the first call
        does it all; shielded: a disconnect must not leave a slot held). The settle's answer:
        True when the store says a cancel sent to another instance came first (OutputLease.settle).
        A stream's close calls it again after its run's call: once that one has ended, every step
        would find nothing to do (no keep-alive, no stream, no slot, the lease settled: None), so it
        returns None without the shielded scope and the four awaits (about 2 % of a one-token
        stream's CPU, docs/bench-streams.md). A call that raised left `_given_back` unset: the next
        one retries what is left, as before."""
        if self._given_back:
            return None
        with cancel_scope(shield=True):
            await self._stop_keepalive()
            await self._give_back_slot()
            # A request not charged (_charged) gets its prompt's tokens and the request back. A
            # cancel answered here goes with the settle, for another instance to answer its repeat.
            settle = self._lease.settle(ran=self._charged, cancelled=self._live.cancelled)
            cancelled_elsewhere = await _quietly(settle, "lease_settle_failed", self.request_id)
        if cancelled_elsewhere:
            self._live.cancelled_elsewhere()
        self._given_back = True
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
        self._record_turns(out)
        try:
            # After the reply's turn (its id minted: edge/messages/ids.py), so the next request's
            # question is stored after it on every edge; before the request counts as finished
            # (`_record`), and before a stream's last events: a client that sees the end may send
            # its next question at once.
            if self._conversation_lock is not None:
                await self._conversation_lock.release()
        finally:
            self._record(out)

    def _record_prompt(self) -> None:
        """A named conversation's question, stored with a stream's first text (`on_text`): a
        request that got none (turned away by the queue, cancelled while queued, refused by its
        replica, failed or cut before any text: an error event alone, refunded whole) has no
        answer, and a client retrying it, as the error invites, would find its question twice
        (stored when the request reached a replica, a replica's 400 or 502 left it with an empty
        reply; a review). Stored then rather than with the reply, so that an edge dying mid-stream
        still leaves the question. Not streamed, it is stored with the reply (`_record`)."""
        conversation_id = self._req.conversation_id
        if conversation_id is None or self._p.messages is None:
            return
        messages = self._req.messages
        if self._continues_reply:
            # The continued reply is the turn's own (`_record_turns`): its question comes before it.
            messages = messages[:-1]
        for question in _questions(messages):
            self._made_turn(
                self._p.messages.record_prompt(
                    conversation_id,
                    self._principal.user,
                    self.request_id,
                    question.text(),
                    question.name,
                    after=self._newest_turn(),
                )
            )

    @property
    def _continues_reply(self) -> bool:
        """The request continues an assistant's message (continue_final_message): a beginning the
        client wrote (a prefill) or a reply it got before. Either way the edge cannot tell which,
        so the turn is stored as any other: the user's messages that led to it, then the reply
        whole. Stored as the reply alone, a prefill's question was lost, and the history read back
        was an answer to nothing (a review)."""
        return self._req.prompt_end == "continue" and self._req.messages[-1].role == "assistant"

    def _newest_turn(self) -> str | None:
        """The conversation's newest message id, as its lock knows it: this request's turns sort
        after it, whichever edge's clock made it (edge/messages/conversation_lock.py)."""
        return None if self._conversation_lock is None else self._conversation_lock.last_message_id

    def _made_turn(self, message_id: str) -> None:
        """The conversation's newest now, left in its lock for the next request by the release."""
        if self._conversation_lock is not None:
            self._conversation_lock.last_message_id = message_id

    def _record(self, out: Outcome) -> None:
        tier = self._principal.tier
        model = self._p.dispatcher.model
        # The line's counts are what the user is charged, as `usage`, the limiter and /v1/usage
        # count them: a request refunded whole logged its prompt and the tokens its replica made
        # before failing, and a bill reconciled from the logs charged for a 502 (a review). What
        # the replica made, charged or not, is generated_tokens. The token counters count the
        # same: counted at admission and as generated, a refunded request's prompt and tokens
        # were served tokens nobody paid for (a review).
        prompt_tokens, completion_tokens, cached_tokens = self._billed(out)
        child(metrics.PROMPT_TOKENS, model, tier).inc(prompt_tokens)
        child(metrics.GENERATION_TOKENS, model, tier).inc(completion_tokens)
        child(metrics.REQUESTS_FINISHED, model, tier, out.reason).inc()
        duration_s = time.perf_counter() - self._arrived
        child(metrics.REQUEST_DURATION, model, tier, out.reason).observe(duration_s)
        if out.ttft_s is not None:
            child(metrics.TTFT, model, tier).observe(out.ttft_s)
        fields = {
            "request_id": self.request_id,
            "user": self._principal.user,
            "tier": tier,
            "model": self._p.config.model_name,
            "stream": bool(self._req.stream),
            "outcome": out.reason,
            # What the client got: a stream is a 200 whatever its end (an error is an event in
            # it); one not streamed, its error's status, or 499 where it left first (its route).
            "status": _status(out, bool(self._req.stream)),
            "error": None if out.error is None else out.error.detail.code or out.error.detail.type,
            "upstream": out.upstream,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "generated_tokens": out.completion_tokens,
            "ttft_ms": None if out.ttft_s is None else round(out.ttft_s * 1000, 2),
            "duration_ms": round(duration_s * 1000, 2),
        }
        if out.error is not None and out.error.status >= 500:
            # The server's own trouble after admission (no replica, a replica's failure, the drain's
            # cut): a warning an operator filters for, as the same trouble refused before admission
            # is (refusal_line); logged at info, a queued request's 503 no_replica hid among the
            # successes.
            log.warning("chat_completion", **fields)
        else:
            info_line(log, "chat_completion", fields)
        if self._p.usage is not None and self._charged:
            # Exactly what the lease settled as charged: the prompt and every granted token (a
            # request not charged was refunded whole, and costs nothing).
            self._p.usage.record(
                self._principal.user,
                self._p.config.model_name,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                arrived_s=self.created,
            )

    def _record_turns(self, out: Outcome) -> None:
        """A named conversation's turns, handed to the message writer (ConversationLog)."""
        conversation_id = self._req.conversation_id
        if conversation_id is None or self._p.messages is None:
            return
        if not self._req.stream:
            # The client gets the reply whole, or an error alone: both turns are stored with the
            # answer, and neither with the error (a 502 or 503, which invite a retry, left the
            # question twice in the history, and a reply the client never saw; a review), nor for
            # a client that hung up first (an SDK's read timeout, which it retries; a review).
            if not self._charged or out.reason == "disconnected":
                return
            self._record_prompt()
        elif not self._prompt_recorded:
            # A stream's question is stored with its first text; one answered with none sent while
            # it ran (a reply of no tokens, a cancel during its prefill, text held to its end:
            # charged, ended as replies end) stores it now, as one not streamed does; one answered
            # with an error alone (refunded), or whose client left first, stores nothing.
            if not self._charged or out.reason == "disconnected":
                return
            self._prompt_recorded = True
            self._record_prompt()
        reply = "".join(out.text)
        if self._continues_reply:
            # The client began the reply: the stored turn is the whole of it, not its end alone. A
            # continued user message is the question's turn (`_record_prompt`), not the reply's.
            reply = self._req.messages[-1].text() + reply
        self._made_turn(
            self._p.messages.record_reply(
                conversation_id,
                self._principal.user,
                self.request_id,
                reply,
                _stored_finish_reason(out),
                self._p.config.model_name,
                after=self._newest_turn(),
            )
        )


class _NotRetried(UpstreamError):
    """A request whose replica failed before its first token found no replica to take it again:
    its 502 says when to try again, as the queue's refusal did."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _as_upstream_error(caught: Exception, deltas: AsyncIterator[Delta] | None) -> UpstreamError:
    """What a replica's relay raised, as the UpstreamError it is: where the replica's own stream
    raised something else (an adapter's bug, a transport error it does not map) the replica
    failed all the same, and the request ends as when it says so (retried before its first token,
    else a 502, or an error event after what the stream got; the replica suspect). It was a 500
    not streamed, charged the tokens the client never saw, and a stream cut without its last text
    or its usage chunk (a review). Told apart by the traceback, read only then (no frame per
    token); anything else, the edge's own, is raised as is, for Generation._run to answer."""
    if isinstance(caught, UpstreamError):
        return caught
    if isinstance(caught, RequestRejected):
        raise caught  # the contract's other error: the request's own fault
    code = getattr(deltas, "ag_code", None)
    tb = caught.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    if tb is None:
        raise caught
    log.error("upstream_raised", error=repr(caught), exc_info=caught)
    return UpstreamError(f"the replica's stream raised {caught!r}")


def _retry_after_s(exc: UpstreamError) -> float | None:
    """When a retry of a request that failed this way should succeed, where known: the replica is
    being restarted (never sooner than MIN_RETRY_S: an overdue one is no reason for a burst), or
    the queue said."""
    if isinstance(exc, ReplicaRestarting):
        return max(exc.back_in_s, MIN_RETRY_S)
    if isinstance(exc, _NotRetried):
        return exc.retry_after_s
    return None


def _questions(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The user's messages a request asks, in order: those after the assistant's last turn (a
    question in two parts, two participants speaking before the assistant answers: the model read
    them all, and the history kept the last alone), system or developer messages among or after
    them aside (instructions: a reminder, retrieved context, which left the question out of the
    history). None where an assistant's or a tool's message comes after the user's last (a
    continued reply's is taken off first: `_record_prompt`) or where there is none (a system
    prompt alone)."""
    asked: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role == "user":
            asked.append(message)
        elif message.role not in ("system", "developer"):
            if not asked:
                return []
            break
    asked.reverse()
    return asked


def _status(out: Outcome, stream: bool) -> int:
    """The HTTP status the client got, for the request's line."""
    if stream:
        return 200
    if out.reason == "disconnected":
        return 499  # the chat route's, for a client that left before the answer (nobody reads it)
    return 200 if out.error is None else out.error.status


def _stored_finish_reason(out: Outcome) -> str:
    """The API's finish_reason, or what cut the reply short (the history tells a partial reply apart):
    the user's token budget (its marker) too, which stored as `length` read as a reply that reached
    its max_tokens."""
    if out.marker == TOKENS_LIMIT_MARKER:
        return "limit_reached"
    if out.reason in (
        "cancelled",
        "error",
        "rejected",
        "disconnected",
        "drained",
        "key_inactive",
        "limiter_unavailable",
    ):
        return out.reason
    return out.finish_reason


async def _quietly(step: Awaitable[_T], what: str, request_id: str) -> _T | None:
    # Clean-up steps must all run: one failing (a store hiccup) is logged, not raised.
    try:
        return await step
    except Exception as exc:
        log.warning(what, request_id=request_id, error=repr(exc))
        return None

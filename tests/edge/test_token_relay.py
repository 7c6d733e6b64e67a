"""edge/token_relay.py with an upstream that hands deltas over in its step (generate_direct): one
step relays a token to every stream without waking their tasks, in order and within each budget;
whatever would wait (a paused writer, the budget's end, the last delta) goes through the task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bench.paced_upstream import TOKEN_ID, PacedUpstream
from edge.cancel.stream_close import aclose_stream
from edge.generation import Outcome
from edge.text.stops import StopMatcher
from edge.token_relay import TOKENS_LIMIT_MARKER, TokenRelay
from edge.upstreams.base import Delta, GenerationRequest, UpstreamError
from gpu_container.engine.async_engine import AsyncEngine
from gpu_container.engine.engine import LLMEngine
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import EngineConfig, TokenOutput
from limiter.lease import Lease
from tests.support.live_server import demo_model_dir

pytestmark = pytest.mark.anyio


class _Lease:
    """A local budget of `left` tokens: try_take always answers (no store)."""

    def __init__(self, left: int) -> None:
        self.left = left

    def try_take(self, n: int) -> int:
        granted = min(n, self.left)
        self.left -= granted
        return granted

    async def take(self, n: int) -> int:
        raise AssertionError("try_take answers every call here")


class _Detok:
    def push(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def flush(self) -> str:
        return ""


class _Stream:
    """One stream: its relay, what it wrote, and how many deltas woke its task."""

    def __init__(
        self,
        budget: int,
        writer: Callable[[_Stream, str], Awaitable[None] | None] | None = None,
        stops: list[str] | None = None,
        detok: Any = None,
    ) -> None:
        self.out = Outcome()
        self.lease = _Lease(budget)
        self.written: list[str] = []
        self.woken = 0
        self.grown: list[int] = []
        self.gaps: list[float] = []
        self._writer = writer
        self.relay = TokenRelay(
            self.out,
            self._on_text,
            detok or _Detok(),
            StopMatcher(stops or []),
            self.lease,  # type: ignore[arg-type]
            self.grown.append,
            0.0,
            self._first,
            self.gaps.append,
        )

    def _on_text(self, text: str) -> Awaitable[None] | None:
        if self._writer is not None:
            return self._writer(self, text)
        self.written.append(text)
        return None

    @staticmethod
    async def _first() -> None:
        return None

    async def counted(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        async for delta in deltas:
            self.woken += 1
            yield delta

    async def run(self, upstream: PacedUpstream, max_new: int) -> None:
        req = GenerationRequest(request_id="r", prompt_ids=[1], max_new_tokens=max_new)
        deltas = upstream.generate_direct(req, self.relay.offer)
        try:
            await self.relay.run(self.counted(deltas))
        finally:
            await aclose_stream(deltas)


TOKEN = f"<{TOKEN_ID}>"


async def test_one_step_relays_a_token_to_every_stream_without_waking_their_tasks() -> None:
    upstream = PacedUpstream(0.001, replicas=1)
    streams = [_Stream(budget=100) for _ in range(20)]
    await asyncio.gather(*(s.run(upstream, 10) for s in streams))
    await upstream.aclose()
    for s in streams:
        assert s.out.completion_tokens == 10
        assert s.out.reason == "length"
        assert s.out.marker is None  # the replica's own length, not the budget
        # Nine tokens written in order (the last one is held for the closing events).
        assert s.written == [TOKEN] * 9 and s.out.held == [TOKEN]
        assert s.grown == list(range(1, 11))
        assert s.woken == 2  # the first token and the last delta only


async def test_a_budget_that_ends_mid_stream_stops_exactly_with_the_marker() -> None:
    upstream = PacedUpstream(0.001, replicas=1)
    short, long = _Stream(budget=4), _Stream(budget=100)
    await asyncio.gather(short.run(upstream, 10), long.run(upstream, 10))
    await upstream.aclose()
    assert short.out.completion_tokens == 4
    assert short.lease.left == 0
    assert short.out.reason == "length" and short.out.marker is TOKENS_LIMIT_MARKER
    # All four granted tokens written; the fifth, refused, ended the reply with nothing to hold.
    assert short.written == [TOKEN] * 4 and short.out.held == []
    assert short.woken == 2  # the first token and the refused one
    assert long.out.completion_tokens == 10 and long.out.marker is None


async def test_a_paused_writer_falls_back_to_the_task_and_keeps_the_order() -> None:
    """The third token's write must wait (a slow reader): its task awaits the send, is not offered
    the next tokens meanwhile, and resumes the direct path once the send is done."""
    upstream = PacedUpstream(0.001, replicas=1)
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    order: list[str] = []

    def writer(stream: _Stream, text: str) -> Awaitable[None] | None:
        n = len(stream.written) + 1
        stream.written.append(f"{text}{n}")
        if n != 3:
            return None

        async def send() -> None:
            order.append("send waits")
            loop.call_later(0.01, gate.set_result, None)
            await gate
            order.append("send done")

        return send()

    stream = _Stream(budget=100, writer=writer)
    await stream.run(upstream, 8)
    await upstream.aclose()
    assert order == ["send waits", "send done"]
    assert stream.written == [f"{TOKEN}{n}" for n in range(1, 8)]
    assert stream.out.completion_tokens == 8
    # First token, the waiting write's token, the last delta: the others went straight through.
    assert stream.woken == 3


class _Counting:
    """Each token's text is its place in the reply: "<1>", "<2>", ..."""

    def __init__(self) -> None:
        self.count = 0

    def push(self, ids: list[int]) -> str:
        texts = []
        for _ in ids:
            self.count += 1
            texts.append(f"<{self.count}>")
        return "".join(texts)

    def flush(self) -> str:
        return ""


async def test_a_reply_with_stop_strings_takes_the_direct_path_until_one_is_found() -> None:
    """Stop strings are matched where the step hands the token over: only the first token and the
    one that completes the stop string wake the task, which ends the reply with the text before it."""
    upstream = PacedUpstream(0.001, replicas=1)
    stream = _Stream(budget=100, stops=["<6>", "<9>"], detok=_Counting())
    await stream.run(upstream, 20)
    await upstream.aclose()
    assert "".join(stream.written) == "<1><2><3><4><5>"
    assert (stream.out.reason, stream.out.completion_tokens) == ("stop", 6)
    assert stream.woken == 2


async def test_a_cancelled_stream_is_offered_nothing_more_and_ends_its_sequence() -> None:
    """Cancelled from inside a step (as a disconnect's cancel can land between two streams' offers):
    the next steps skip it, and closing its deltas (the pipeline's _give_back_slot) ends the sequence."""
    upstream = PacedUpstream(0.001, replicas=1)
    tasks: list[asyncio.Task[None]] = []

    def writer(stream: _Stream, text: str) -> None:
        stream.written.append(text)
        if len(stream.written) == 5:
            tasks[0].cancel()

    stream, other = _Stream(budget=100, writer=writer), _Stream(budget=100)
    tasks.append(asyncio.ensure_future(stream.run(upstream, 1000)))
    await other.run(upstream, 30)  # 30 steps of the clock both streams share
    await asyncio.wait(tasks)
    await upstream.aclose()
    assert tasks[0].cancelled()
    assert stream.written == [TOKEN] * 5
    assert stream.out.completion_tokens == 5
    assert upstream._clocks[0].live == 0


async def test_a_paused_writer_on_the_engines_mailbox_relays_each_token_once() -> None:
    """The in-process engine's front offers each output as a Delta of its own making: a delta the
    relay took and declined (its write had to wait, or it held a stop string) must reach the task as
    that same delta, or the task relays its tokens a second time."""
    engine = LLMEngine.from_pretrained(demo_model_dir(), EngineConfig(block_size=16, num_blocks=32))
    engine.start()
    upstream = AsyncEngine(engine, "local-0")

    def request(rid: str) -> GenerationRequest:
        return GenerationRequest(rid, [1, 2, 3], max_new_tokens=12, temperature=0.0, ignore_eos=True)

    def writer(stream: _Stream, text: str) -> Awaitable[None] | None:
        stream.written.append(text)
        if len(stream.written) % 3:
            return None
        return asyncio.sleep(0)  # a send that waits: the slow reader's flow control

    async def relayed(stream: _Stream, rid: str) -> list[str]:
        deltas = upstream.generate_direct(request(rid), stream.relay.offer)
        try:
            await stream.relay.run(stream.counted(deltas))
        finally:
            await aclose_stream(deltas)
        # With what the last delta held for the closing events: how many tokens that delta carries
        # depends on when the loop took the outputs (a lagging reader's merge), so only the whole
        # reply is the same from run to run.
        return [*stream.written, *stream.out.held]

    try:
        plain = await relayed(_Stream(budget=100), "plain")
        paused = _Stream(budget=100, writer=writer)
        # The same text (how it is split into writes depends on when the loop takes each output).
        assert "".join(await relayed(paused, "paused")) == "".join(plain)
        assert paused.out.completion_tokens == 12
    finally:
        await upstream.aclose()


async def test_a_stop_string_inside_a_merged_delta_ends_the_count_at_its_token() -> None:
    """A reader that lagged gets several tokens in one delta: the tokens after the one completing
    the stop string are neither counted nor charged, so the reply's usage does not depend on when
    its reader caught up (as vLLM stops at that token)."""

    async def deltas() -> AsyncIterator[Delta]:
        yield Delta([1], None, 16)
        yield Delta([2, 3, 4, 5])  # "<3>" ends the reply at the second of these
        yield Delta([6], "length")

    for merged in (True, False):
        stream = _Stream(budget=100, stops=["<3>"])
        if merged:
            await stream.relay.run(deltas())
        else:
            await stream.relay.run(Delta([i], None, 16 if i == 1 else 0) async for i in _ids(1, 6))
        assert stream.out.reason == "stop"
        assert "".join(stream.written) == "<1><2>"
        assert stream.out.completion_tokens == 3
        assert stream.lease.left == 97
        assert stream.out.cached_tokens == 16


async def _ids(first: int, last: int) -> AsyncIterator[int]:
    for i in range(first, last + 1):
        yield i


class _Store:
    """The lease's store: every extension granted up to `grant` tokens."""

    def __init__(self, grant: int) -> None:
        self.grant = grant

    async def charge(self, user: str, tier: Any, request_id: str, want: int) -> int:
        return min(want, self.grant)

    async def settle(self, user: str, tier: Any, request_id: str, refund: int, **_: Any) -> None:
        return None


class _Relayed:
    """A relay over a real Lease and the engine's Mailbox, as the in-process front reads it; the
    write of token 2's text must wait (a paused transport), until `drained` where `paused`."""

    def __init__(
        self, granted: int, grant: int, stops: list[str] | None = None, paused: bool = False
    ) -> None:
        self.out = Outcome()
        self.sent: list[str] = []
        self.write_started = asyncio.Event()
        self.drained = asyncio.Event()
        if not paused:
            self.drained.set()
        self.lease = Lease(
            _Store(grant),
            "user",
            None,  # type: ignore[arg-type]
            "r",
            input_tokens=1,
            granted=granted,
            max_output_tokens=100,
            batch_tokens=4,
            slot_ttl_s=300.0,
        )
        self.relay = TokenRelay(
            self.out,
            self._on_text,
            _Detok(),
            StopMatcher(stops or []),
            self.lease,
            None,
            0.0,
            _Stream._first,
            lambda gap: None,
        )
        self.mailbox = Mailbox(asyncio.get_running_loop())
        self.mailbox.offer = self.relay.offer
        self.task = asyncio.ensure_future(self.relay.run(self._deltas()))

    def _on_text(self, text: str) -> Awaitable[None] | None:
        if "<2>" not in text:
            self.sent.append(text)
            return None

        async def send() -> None:
            # As uvicorn's send: nothing is written until a paused transport drains.
            self.write_started.set()
            await self.drained.wait()
            self.sent.append(text)

        return send()

    def reply(self) -> str:
        """What the client gets: the text written, then the closing events' (edge/generation.py)."""
        return "".join(self.sent) + self.out.unwritten + "".join(self.out.held)

    async def _deltas(self) -> AsyncIterator[Delta]:
        while (delta := await self.mailbox.take()).finish_reason is None:
            yield delta
        yield delta

    async def feed(self, *outputs: list[int]) -> None:
        """Each engine output once the task waits with the tokens before it counted; the last is
        put without waiting for the relay to take it."""
        counted = 0
        for ids in outputs:
            await self.waiting(counted)
            self.mailbox.put(TokenOutput("r", ids))
            counted += len(ids)

    async def cut(self) -> None:
        """A cancel (the cancel endpoint, the drain's deadline, its key's end) of the task."""
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task

    async def waiting(self, tokens: int) -> None:
        """Bounded in loop turns: until the task waits in the mailbox with `tokens` counted."""
        for _ in range(50):
            waiter = self.mailbox._waiter
            if waiter is not None and not waiter.done() and self.out.completion_tokens == tokens:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"the relay never waited with {tokens} tokens counted")


async def test_a_delta_declined_part_done_is_relayed_before_a_failure_after_it() -> None:
    """The relay counted and charged token 2, its write left to await, and declined it; the engine
    failed in the same delivery. Raised first, the failure dropped that delta: counted in usage and
    charged, never sent."""
    stream = _Relayed(granted=100, grant=0)
    await stream.feed([1], [2])  # the first token: the task's
    stream.mailbox.fail(UpstreamError("the engine died"))
    with pytest.raises(UpstreamError):
        await stream.task
    assert "".join(stream.sent) == "<1><2>"
    assert stream.out.completion_tokens == stream.lease.used == 2


async def test_a_short_grant_then_a_failure_charges_what_usage_counts() -> None:
    """The store granted 3 of the 4 tokens asked: what the budget held then, not its end (the
    lease asks again once they are used: limiter/lease.py). `offer` cannot cover the 3-token delta
    with the 2 held and leaves it to the task, which extends the lease for it and relays it; the
    failure after it ends the reply as a failure, not with the budget's marker (the
    lease took the short grant for the budget's end: `offer` charged 2 tokens more, and the reply
    ended "limit_reached" with the budget unspent)."""
    stream = _Relayed(granted=1, grant=3)
    # [3]: nothing left, the task extends the lease by 3 of the 4 asked; [4, 5, 6]: 2 held.
    await stream.feed([1], [3], [4, 5, 6])
    stream.mailbox.fail(UpstreamError("the engine died"))
    with pytest.raises(UpstreamError):
        await stream.task
    assert stream.out.marker is None
    assert stream.out.completion_tokens == stream.lease.used == 5  # the task extended the lease
    assert stream.reply() == "<1><3><4><5><6>"


async def test_a_stop_string_found_in_offer_ends_the_reply_though_a_failure_follows() -> None:
    stream = _Relayed(granted=100, grant=0, stops=["2>"])
    await stream.feed([1], [2])
    stream.mailbox.fail(UpstreamError("the engine died"))
    await stream.task
    assert stream.out.reason == "stop"
    assert "".join(stream.sent) == "<1><"


@pytest.mark.parametrize("started", [False, True], ids=["before-its-turn", "awaiting-the-drain"])
async def test_a_write_a_cut_stops_is_sent_with_the_closing_events(started: bool) -> None:
    """A cancel (the cancel endpoint, the drain's deadline, its key's end) while token 2's write
    waited its turn, or waited for a paused transport to drain: its text was counted and charged,
    and dropped, though the cut reply is still written."""
    stream = _Relayed(granted=100, grant=0, paused=True)
    await stream.feed([1], [2])
    if started:
        await stream.write_started.wait()
    await stream.cut()
    assert stream.reply() == "<1><2>"
    assert stream.out.completion_tokens == stream.lease.used == 2


async def test_a_stop_string_found_in_offer_then_a_cut_keeps_the_text_before_it() -> None:
    stream = _Relayed(granted=100, grant=0, stops=["2>"])
    await stream.feed([1], [2])
    await stream.cut()
    assert stream.reply() == "<1><"
    assert stream.out.completion_tokens == stream.lease.used == 2


async def test_a_short_grant_then_a_cut_counts_what_it_charged() -> None:
    stream = _Relayed(granted=1, grant=3)
    await stream.feed([1], [3], [4, 5, 6])
    await stream.cut()
    assert stream.out.completion_tokens == stream.lease.used
    assert stream.reply() == "".join(f"<{i}>" for i in [1, 3, 4, 5, 6][: stream.lease.used])


@pytest.mark.parametrize("budget_spent", [False, True], ids=["mid-reply", "after-a-zero-grant"])
async def test_a_cut_sends_the_text_the_stop_matcher_held_back(budget_spent: bool) -> None:
    """Token 3's text "<3>" may begin the stop string "<3>X": the matcher holds it back, counted and
    charged. A reply's end flushes it (`emit_tail`), the budget's end included (`offer` granted 0
    of the next token); a cut dropped it."""
    stream = _Relayed(
        granted=100 if not budget_spent else 1, grant=0 if not budget_spent else 1, stops=["<3>X"]
    )
    if budget_spent:
        await stream.feed([1], [3], [4])  # [4]: nothing left, `offer` is granted none of it
    else:
        await stream.feed([1], [3])
        await stream.waiting(2)
    await stream.cut()
    assert stream.out.completion_tokens == stream.lease.used == 2
    assert stream.reply() == "<1><3>"

"""The token path under random interleavings, through both upstreams that hand deltas to the relay
in their own callback (edge/upstreams/direct.py): the in-process engine's Mailbox and Triton's
SseConnection. Whatever order the loop runs things in (a reader that lags and takes several
outputs merged, a write left waiting on a paused transport, a lease whose store answers a few
turns late, the first token's own awaits, a stop string met in `offer` or in the task) and however
the stream ends (the replica's finish, the token budget's end, a stop string, a failure, a cut), what
the client gets, what usage counts and what it is charged agree:

- the text the client gets (what was written, then the closing events' `unwritten` and `held`) is
  the text of the tokens usage counts, up to the first stop string;
- usage (`completion_tokens`) is what the lease used, what the store was left charging once the
  lease settled, and what the replica's KV accounting was grown to;
- the token budget's marker ends a reply only where the budget is spent, and a reply the replica
  finished has exactly the tokens, the reason and the marker its budget and stop strings allow;
- the prefix-cache hit is reported with the first token.

Why a search and not only examples: every fault of the token path fixed since 5eb85d6 was one
particular interleaving, found by review, and the hand-written tests (tests/edge/test_token_relay.py,
tests/triton/test_sse_wire.py) pin each of those; this module walks the space around them, where the
next one would be. The seeds are fixed and the loop runs them the same way each time, so a failure
names the seed that replays it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from edge.cancel.scope import cancel_scope
from edge.cancel.stream_close import aclose_stream
from edge.generation import Outcome
from edge.text.stops import StopMatcher
from edge.token_relay import TOKENS_LIMIT_MARKER, TokenRelay
from edge.upstreams.base import Delta, GenerationRequest, UpstreamError
from edge.upstreams.triton import TritonUpstream
from edge.upstreams.triton_sse import SseConnection
from gpu_container.engine.front import EngineFront
from gpu_container.engine.mailbox import Mailbox
from gpu_container.engine.types import EngineStats, SamplingParams, TokenOutput
from limiter.lease import Lease
from tests.edge.test_token_relay import _Detok
from tests.triton.test_sse_wire import END, HEAD, _Transport, chunk

pytestmark = pytest.mark.anyio

# 300 interleavings a path, in chunks of 50 seeds a test: pytest's overhead per test would cost more
# than the seeds themselves (the module's tests take under half a second).
SEEDS = 300
CHUNK = 50
# The prefix-cache hit of every reply: Triton reports reused blocks, which the edge turns into
# tokens with the block size its metrics page gives.
REUSED_BLOCKS = 2
BLOCK_TOKENS = 8
CACHED_TOKENS = REUSED_BLOCKS * BLOCK_TOKENS
METRICS_PAGE = b'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} %d\n' % BLOCK_TOKENS
# More loop turns than the relay's busiest delta takes (the store's, the write's and the first
# token's waits, a few turns each).
SETTLED_TURNS = 20
# A relay left waiting for a delta that never comes fails its seed instead of hanging the suite.
HANG_S = 5.0

Ending = Literal["finish", "fail", "cut"]


async def _turns(rng: random.Random, most: int) -> None:
    """Up to `most` turns of the loop: what else is ready (reads, the relay's task) runs meanwhile."""
    for _ in range(rng.randint(0, most)):
        await asyncio.sleep(0)


async def _replica_step(rng: random.Random) -> None:
    """The wait for the replica's next output: mostly long enough for the relay to settle and wait
    for it, which then takes it in `offer` (a replica is far slower than the edge); else a few turns
    at most, where the relay is still busy and reads several outputs at once (an edge lagging under
    load)."""
    turns = SETTLED_TURNS if rng.random() < 0.6 else rng.randint(0, 3)
    for _ in range(turns):
        await asyncio.sleep(0)


def _next_ids(rng: random.Random, fed: int, last: int) -> list[int]:
    """The next output's tokens after the `fed` first, never past `last`: mostly one (a step's),
    sometimes up to three (a replica that sends a few steps' tokens at once)."""
    size = 1 if rng.random() < 0.7 else rng.randint(2, 3)
    return list(range(fed + 1, min(fed + size, last) + 1))


@dataclass(frozen=True)
class _Case:
    """One seed's reply: `tokens` long on the replica, which sends `fed` of them before the
    ending; a lease granted `granted` at admission and `store_grant` more in all by its store."""

    seed: int
    tokens: int
    fed: int
    ending: Ending
    granted: int
    store_grant: int
    stops: tuple[str, ...]
    # A cut landing inside the client's n-th write (a disconnect noticed while a step's writes are
    # sent), which runs in the upstream's own callback (`offer`) or in the task.
    cut_in_write: int | None

    def __str__(self) -> str:
        cut = f" (in write {self.cut_in_write})" if self.cut_in_write is not None else ""
        return (
            f"seed {self.seed} ({self.ending}{cut} after {self.fed} of {self.tokens} tokens, "
            f"budget {self.granted}+{self.store_grant}, stops {list(self.stops)})"
        )


def _draw(seed: int) -> tuple[_Case, random.Random]:
    """The case of `seed`, and the generator its interleaving goes on drawing from."""
    rng = random.Random(seed)
    tokens = rng.randint(1, 25)
    ending: Ending = rng.choice(["finish", "fail", "cut"])
    s = rng.randint(1, 25)
    # "<s>" ends the reply at token s; "<s><s+1>X" never matches but holds text back in the
    # matcher across tokens, which a cut or a failure must still send.
    stops = rng.choice([(), (f"<{s}>",), (f"<{s}><{s + 1}>X",), (f"<{s}>", "<3><4>X")])
    case = _Case(
        seed=seed,
        tokens=tokens,
        fed=tokens if ending == "finish" else rng.randint(0, tokens),
        ending=ending,
        granted=rng.randint(1, 6),
        store_grant=rng.randint(0, 30),
        stops=stops,
        cut_in_write=rng.randint(1, 6) if ending == "cut" and rng.random() < 0.5 else None,
    )
    return case, rng


def _counted_text(tokens: int, stops: tuple[str, ...]) -> str:
    """The text of the first `tokens` tokens (_Detok's), up to the first stop string in it."""
    text = "".join(f"<{i}>" for i in range(1, tokens + 1))
    for stop in stops:
        text = text.split(stop)[0]
    return text


def _stop_token(case: _Case) -> int | None:
    """The token that completes the reply's first stop string, if one does."""
    for k in range(1, case.tokens + 1):
        if _counted_text(k, case.stops) != _counted_text(k, ()):
            return k
    return None


class _Store:
    """The lease's store: answers each extension after a few loop turns, granting what is left of
    `left`, and keeps what it charged and was refunded."""

    def __init__(self, left: int, rng: random.Random) -> None:
        self.left = left
        self.charged = 0
        self.refunded = 0
        self._rng = rng

    async def charge(self, user: str, tier: Any, request_id: str, want: int) -> int:
        await _turns(self._rng, 3)
        got = min(want, self.left)
        self.left -= got
        self.charged += got
        return got

    async def settle(self, user: str, tier: Any, request_id: str, refund: int, **_: Any) -> None:
        self.refunded += refund


class _Stream:
    """One stream as edge/generation.py runs it: the relay over a real Lease, in the scope a cut
    cancels, then its upstream closed and the lease settled. The client's writes are sometimes left
    to await (a paused transport), its first token's hook awaits too (the keep-alive's stop)."""

    def __init__(self, case: _Case, rng: random.Random) -> None:
        self._rng = rng
        self._cut_in_write = case.cut_in_write
        self._writes = 0
        self.out = Outcome()
        self.sent: list[str] = []
        self.grown: list[int] = []
        self.failure: UpstreamError | None = None
        self.hung = False
        self.store = _Store(case.store_grant, rng)
        self.lease = Lease(
            self.store,
            "user",
            None,  # type: ignore[arg-type]
            "r",
            input_tokens=1,
            granted=case.granted,
            max_output_tokens=100,
            batch_tokens=2,  # small: the budget's end comes mid-delta, between extensions
            slot_ttl_s=300.0,
        )
        self.relay = TokenRelay(
            self.out,
            self._on_text,
            _Detok(),
            StopMatcher(list(case.stops)),
            self.lease,
            self.grown.append,
            0.0,
            self._on_first,
            lambda gap: None,
        )
        self.scope = cancel_scope()

    def reply(self) -> str:
        """What the client gets: the text written, then the closing events' (edge/generation.py)."""
        return "".join(self.sent) + self.out.unwritten + "".join(self.out.held)

    def _on_text(self, text: str) -> Awaitable[None] | None:
        self._writes += 1
        if self._writes == self._cut_in_write:
            # Left to await: a relay that declines a delta after its own task was cancelled leaves
            # the upstream a done waiter (gpu_container/engine/mailbox.py's put).
            self.scope.cancel()
            return self._send(text, self._rng.randint(0, 3))
        if self._rng.random() < 0.75:
            self.sent.append(text)
            return None
        return self._send(text, self._rng.randint(0, 3))

    async def _send(self, text: str, turns: int) -> None:
        # As uvicorn's send: nothing is written until a paused transport drains, so a write cut
        # meanwhile wrote nothing.
        for _ in range(turns):
            await asyncio.sleep(0)
        self.sent.append(text)

    async def _on_first(self) -> None:
        await _turns(self._rng, 2)

    async def run(self, deltas: AsyncIterator[Delta]) -> None:
        try:
            with self.scope:
                await self.relay.run(deltas)
        except UpstreamError as exc:
            self.failure = exc
        finally:
            await aclose_stream(deltas)
            await self.lease.settle()

    async def ended(self, task: asyncio.Task[None]) -> None:
        try:
            async with asyncio.timeout(HANG_S):
                await task
        except TimeoutError:
            self.hung = True


def _violations(case: _Case, stream: _Stream) -> list[str]:
    """What the module proves that this seed's stream broke, each named with the seed."""
    out, lease, store = stream.out, stream.lease, stream.store
    found: list[str] = []
    if stream.hung:
        found.append("the stream never ended")
    if stream.reply() != _counted_text(out.completion_tokens, case.stops):
        found.append(f"text: the client got {stream.reply()!r} for {out.completion_tokens} tokens")
    if out.completion_tokens != lease.used:
        found.append(f"usage: {out.completion_tokens} tokens counted, the lease used {lease.used}")
    charged = case.granted + store.charged - store.refunded
    if charged != out.completion_tokens:
        found.append(f"charge: {charged} tokens charged for {out.completion_tokens} counted")
    if (stream.grown[-1] if stream.grown else 0) != out.completion_tokens:
        found.append(f"KV accounting: grown to {stream.grown[-1:]}, {out.completion_tokens} counted")
    if out.marker is not None and (store.left or lease.used != lease.granted):
        found.append(f"marker: budget not spent ({lease.used} of {lease.granted}, {store.left} left)")
    if out.ttft_s is not None and out.cached_tokens != CACHED_TOKENS:
        found.append(f"cached_tokens: {out.cached_tokens}")
    if case.ending == "finish" and not stream.hung:
        budget = case.granted + case.store_grant
        stop = _stop_token(case)
        if stop is not None and stop <= budget:
            expected: tuple[object, ...] = ("stop", None, stop)
        elif budget < case.tokens:
            expected = ("length", TOKENS_LIMIT_MARKER, budget)
        else:
            expected = ("length", None, case.tokens)
        got = (out.reason, out.marker, out.completion_tokens)
        if got != expected:
            found.append(f"end: (reason, marker, tokens) {got}, expected {expected}")
    details = (
        f"[{out.reason}, {out.completion_tokens} tokens, sent {stream.sent}, "
        f"unwritten {out.unwritten!r}, held {out.held}]"
    )
    return [f"{case}: {violation} {details}" for violation in found]


class _Engine(EngineFront):
    """An in-process engine front whose outputs the test puts in the request's mailbox by hand:
    `_submit` is EngineFront's hook for its engines, so its own `generate_direct` runs unchanged."""

    name = "local-0"

    def __init__(self) -> None:
        self.mailbox: Mailbox | None = None

    def _submit(self, req: GenerationRequest, params: SamplingParams, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    def abort(self, request_id: str) -> None:
        pass

    def stats(self) -> EngineStats:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return True

    def stop(self) -> None:
        pass


async def _through_the_mailbox(case: _Case, rng: random.Random) -> _Stream:
    stream = _Stream(case, rng)
    engine = _Engine()
    req = GenerationRequest("r", [5, 6, 7], max_new_tokens=case.tokens, temperature=0.0)
    task = asyncio.ensure_future(stream.run(engine.generate_direct(req, stream.relay.offer)))
    await asyncio.sleep(0)  # the task's first turn: the request submitted, its mailbox waited on
    mailbox = engine.mailbox
    assert mailbox is not None
    fed = 0
    while fed < case.fed and not task.done():
        await _replica_step(rng)
        for _ in range(rng.randint(1, 2)):  # the second, put before the task runs, is merged
            if ids := _next_ids(rng, fed, case.fed):
                fed += len(ids)
                last = fed == case.tokens and case.ending == "finish"
                cached = CACHED_TOKENS if ids[0] == 1 else 0  # on the output with the first token
                mailbox.put(TokenOutput("r", ids, "length" if last else None, cached_tokens=cached))
    await _turns(rng, 4)
    if case.ending == "fail":
        mailbox.fail(UpstreamError("the engine died"))
    elif case.ending == "cut":
        stream.scope.cancel()
    await stream.ended(task)
    return stream


def _event(ids: list[int]) -> bytes:
    """One Triton response of `ids`, with the prefix-cache hit TensorRT-LLM reports on each."""
    tokens = str(ids[0]) if len(ids) == 1 else f"[{','.join(map(str, ids))}]"
    return b'data: {"output_ids":%s,"sequence_length":%d,"kv_cache_reused_blocks":%d}\n\n' % (
        tokens.encode(),
        len(ids),
        REUSED_BLOCKS,
    )


class _Replica:
    """Both of a TritonUpstream's connection pools: the stream's connection is the one the test
    feeds; the metrics page (the block size the first delta awaits) comes a few loop turns late; a
    cut stream's `stop` is answered at once."""

    def __init__(self, conn: SseConnection, rng: random.Random) -> None:
        self.conn = conn
        self._rng = rng

    async def connect(self, timeout_s: float, *, fresh: bool = False) -> SseConnection:
        return self.conn

    def release(self, conn: SseConnection) -> None:
        pass

    async def get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        await _turns(self._rng, 10)
        return 200, METRICS_PAGE

    async def fetch(self, request: bytes, what: str, timeout_s: float) -> tuple[int, bytes]:
        return 200, b""

    async def aclose(self) -> None:
        pass


async def _through_triton(case: _Case, rng: random.Random) -> _Stream:
    stream = _Stream(case, rng)
    conn = SseConnection()
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    upstream = TritonUpstream("fake", "http://127.0.0.1:9", "http://127.0.0.1:9/metrics", end_id=-1)
    # The only way to hand the upstream a connection fed by hand (no socket, no server: the test
    # decides what each read brings and when); its real reader, relay batch and `stop` run on it.
    upstream._pool = upstream._metrics_pool = _Replica(conn, rng)  # type: ignore[assignment]
    req = GenerationRequest("r", [5, 6, 7], max_new_tokens=case.tokens, temperature=0.0)
    task = asyncio.ensure_future(stream.run(upstream.generate_direct(req, stream.relay.offer)))
    await asyncio.sleep(0)  # the reader's first turn: it sends the request and waits
    conn.data_received(HEAD)
    fed = 0
    while fed < case.fed and not task.done():
        await _replica_step(rng)
        data = b""
        for _ in range(rng.randint(1, 2)):  # one read may bring several responses
            if ids := _next_ids(rng, fed, case.fed):
                data += chunk(_event(ids))
                fed += len(ids)
        if fed == case.tokens and case.ending == "finish":
            data += END
        conn.data_received(data)
    await _turns(rng, 4)
    if case.ending == "fail":
        if rng.random() < 0.5:
            conn.data_received(chunk(b'data: {"error":"executor failed"}\n\n'))
        else:
            conn.connection_lost(None)  # the replica died mid-stream
    elif case.ending == "cut":
        stream.scope.cancel()
    await stream.ended(task)
    await upstream.aclose()  # waits for a cut stream's `stop`, sent from a task of its own
    return stream


async def _violations_of(
    path: Callable[[_Case, random.Random], Awaitable[_Stream]], seeds: range
) -> list[str]:
    found: list[str] = []
    for seed in seeds:
        case, rng = _draw(seed)
        try:
            stream = await path(case, rng)
        except Exception as exc:
            exc.add_note(str(case))
            raise
        found += _violations(case, stream)
    return found


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
async def test_the_engine_mailbox_path_sends_counts_and_charges_the_same_tokens(first: int) -> None:
    found = await _violations_of(_through_the_mailbox, range(first, first + CHUNK))
    assert not found, "\n".join(found[:10])


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
async def test_the_triton_path_sends_counts_and_charges_the_same_tokens(first: int) -> None:
    found = await _violations_of(_through_triton, range(first, first + CHUNK))
    assert not found, "\n".join(found[:10])

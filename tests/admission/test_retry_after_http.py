"""An overload 429's Retry-After through the whole edge: when the work its replica holds should free
a place, not what the short requests finished before it took.

The replica streams a token every TOKEN_S at most (it sleeps that long before each: a loaded
machine only makes it slower), so a stream of HOLD tokens holds the replica's one place for at least
HOLD x TOKEN_S from its start whatever the machine does; a few short replies finish first, as a chat
service's do, and teach the edge's service rate that requests are quick."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, events, wait_until
from tests.support.live_server import LiveServer, start_server

TOKEN_S = 0.02
HOLD = 400  # 8 s at the upstream's pace
SHORT = 5


class PacedUpstream:
    """One place (max_sequences=1); each reply is its max_tokens, a token every TOKEN_S or slower."""

    name = "paced"

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(req)

    async def _generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        for k in range(req.max_new_tokens):
            await asyncio.sleep(TOKEN_S)
            yield Delta([300 + k % 50], "length" if k == req.max_new_tokens - 1 else None)

    async def capacity(self) -> Capacity:
        return Capacity(100_000, 0, 1, 0, 0, 16)

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def _provider(settings: Settings, model_dir: Path) -> Any:
    @asynccontextmanager
    async def provide() -> AsyncIterator[list[Upstream]]:
        yield [PacedUpstream()]

    return provide()


def _body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens} | (
        {"stream": True} if stream else {}
    )


@contextmanager
def _held_replica(server: LiveServer, client: httpx.Client) -> Iterator[float]:
    """Short replies first, then a paid stream of HOLD tokens on the only place, its first token
    read. Yields when that stream was sent: it cannot end before HOLD x TOKEN_S after it."""
    for _ in range(3):
        assert client.post(CHAT, json=_body(SHORT, False), headers=server.auth("paid")).status_code == 200
    sent = time.monotonic()
    with client.stream("POST", CHAT, json=_body(HOLD, True), headers=server.auth("paid")) as holder:
        reading = events(holder)
        next(reading)  # the request id
        next(reading)  # a token: it holds the place
        yield sent
    # Leaving the stream closes it: the replica's generation is aborted, the place freed.


def _retry_after_s(refused: httpx.Response) -> float:
    return int(refused.headers["retry-after-ms"]) / 1000


def _held_for_at_least_s(sent: float) -> float:
    """What is left, at the least, of the holder's HOLD tokens now, by the upstream's pace alone;
    the edge measures a rate no faster than that pace, so its estimate of the holder's end can only
    be later. 0.8: the rate's first-token slack and the holder's early tokens."""
    return 0.8 * (HOLD * TOKEN_S - (time.monotonic() - sent))


def test_a_full_queues_retry_after_waits_for_the_streams_holding_the_replica(tmp_path: Path) -> None:
    """queue_full behind a long stream: the 429 names when that stream should end (about 8 s), not
    the time between the short replies' completions (Retry-After 0.2 s before: a client following
    it retried dozens of times, each one refused)."""
    overrides = {"tiers": ROOMY_TIERS, "admission": {"max_queue": 1, "reserved_paid_fraction": 0.0}}
    with (
        start_server(tmp_path, overrides, _provider) as server,
        httpx.Client(base_url=server.base_url, timeout=30.0) as client,
        _held_replica(server, client) as sent,
    ):
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with client.stream("POST", CHAT, json=_body(SHORT, True), headers=server.auth("free")) as queued:
            waiting = events(queued)  # kept: a reader dropped would close the stream
            next(waiting)  # its request id: it waits in the queue now
            wait_until(lambda: dispatcher.queue_depth() == 1, what="the second request to queue")
            refused = client.post(CHAT, json=_body(SHORT, False), headers=server.auth("free2"))
            at_least_s = _held_for_at_least_s(sent)

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "queue_full"
    assert _retry_after_s(refused) >= at_least_s, (refused.headers["retry-after-ms"], at_least_s)
    assert _retry_after_s(refused) <= 60.0


def test_a_wait_the_held_work_makes_too_long_is_refused_up_front(tmp_path: Path) -> None:
    """A free request behind a paid stream of about 8 s, in a tier that waits 2 s at most: a 429
    wait_too_long at once, with the time the stream should end. Before, the estimate from the short
    replies let it into the queue, where it waited the 2 s in vain and ended with an error event
    saying to try again in a few ms."""
    free = ROOMY_TIERS["free"] | {"max_queue_wait_s": 2.0}
    overrides = {"tiers": ROOMY_TIERS | {"free": free}, "admission": {"reserved_paid_fraction": 0.0}}
    with (
        start_server(tmp_path, overrides, _provider) as server,
        httpx.Client(base_url=server.base_url, timeout=30.0) as client,
        _held_replica(server, client) as sent,
        client.stream("POST", CHAT, json=_body(SHORT, True), headers=server.auth("free")) as refused,
    ):
        refused.read()
        at_least_s = _held_for_at_least_s(sent)

    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "wait_too_long"
    assert _retry_after_s(refused) >= at_least_s, (refused.headers["retry-after-ms"], at_least_s)

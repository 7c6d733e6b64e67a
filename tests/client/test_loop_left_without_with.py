"""A reply read in a bare loop, no `with`, and left by a `break` or an exception in the loop's body: the
edge stops generating as the loop lets go of the stream.

The stream and its generator were a reference cycle, which only Python's cyclic collector frees: an
idle program (waiting on input, sleeping) may not run it for a long while, and until then the
connection stayed open and the edge generated the whole reply, billed. The collector is disabled
here, so that a run of it by chance (the in-process edge allocates plenty) cannot free the stream.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import anyio
import pytest

from floodgate_client import AsyncClient, Client, TextDelta
from tests.client.live import LONG_REPLY, LONG_REPLY_TOKENS
from tests.edge.sse_client import wait_until
from tests.support.live_server import LiveServer


class LoopBodyFailed(Exception):
    pass


def _open_streams(server: LiveServer) -> float:
    (line,) = (
        line for line in server.metrics_text().splitlines() if line.startswith("floodgate_open_streams ")
    )
    return float(line.split()[1])


def _disconnected(server: LiveServer) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in server.metrics_text().splitlines()
        if line.startswith("floodgate_requests_finished_total{") and 'reason="disconnected"' in line
    )


@pytest.fixture
def no_cyclic_collection(server: LiveServer) -> Iterator[float]:
    """The collector off for the test; yields the edge's count of disconnected requests, read once no
    earlier test's stream is open (whose end would count)."""
    wait_until(lambda: _open_streams(server) == 0, 30.0, "earlier streams to end")
    before = _disconnected(server)
    gc.disable()
    try:
        yield before
    finally:
        gc.enable()


def _stopped_by_the_disconnect(server: LiveServer, disconnected_before: float) -> None:
    """Not generated to its end (the reason would be "length"): cut by the client's disconnect."""
    wait_until(lambda: _open_streams(server) == 0, 30.0, "the edge to stop the reply")
    assert _disconnected(server) == disconnected_before + 1


@pytest.mark.parametrize("leave", ["break", "raise"])
def test_a_loop_left_without_a_with_block_stops_the_generation(
    server: LiveServer, no_cyclic_collection: float, leave: str
) -> None:
    with Client(server.base_url, server.keys["paid"]) as client:
        with pytest.raises(LoopBodyFailed) if leave == "raise" else contextlib.nullcontext():
            for event in client.chat.stream(LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=0.0):
                if isinstance(event, TextDelta):
                    if leave == "raise":
                        raise LoopBodyFailed
                    break
        _stopped_by_the_disconnect(server, no_cyclic_collection)


@pytest.mark.parametrize("leave", ["break", "raise"])
def test_an_async_loop_left_without_a_with_block_stops_the_generation(
    server: LiveServer, no_cyclic_collection: float, leave: str
) -> None:
    async def main() -> None:
        async with AsyncClient(server.base_url, server.keys["paid"]) as client:
            with pytest.raises(LoopBodyFailed) if leave == "raise" else contextlib.nullcontext():
                async for event in client.chat.stream(
                    LONG_REPLY.prompt, max_tokens=LONG_REPLY_TOKENS, temperature=0.0
                ):
                    if isinstance(event, TextDelta):
                        if leave == "raise":
                            raise LoopBodyFailed
                        break
            # In a thread: the loop must run on, to close the generator the collection handed it.
            await anyio.to_thread.run_sync(lambda: _stopped_by_the_disconnect(server, no_cyclic_collection))

    anyio.run(main)

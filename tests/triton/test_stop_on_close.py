"""Leaving a stream early sends the contract's `stop` request: the replica drops the sequence at
once, without waiting for its poll of closed streams. Here that poll is off (a period of ten
minutes), so only the stop can free the sequence."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from edge.upstreams.base import GenerationRequest
from edge.upstreams.triton import TritonUpstream
from gpu_container.triton.cpu.repository import render_cpu_repository
from gpu_container.triton.launcher import TritonProcess, start_local_triton
from gpu_container.triton.trtllm_metrics import TrtLlmMetrics
from tests.support.connections import established_to
from tests.support.late_request_proxy import late_request_proxy
from tests.support.live_server import demo_model_dir
from tests.support.triton_server import ENGINE_CONFIG, LocalTriton
from tests.triton.reading_task import cancel_after_first_token

PROMPT = [11, 42, 7, 300, 5, 91, 18, 260]
WAIT_S = 20.0
NO_POLL_MS = 600_000


@pytest.fixture(scope="module")
def unpolled_triton() -> Iterator[TritonProcess]:
    with tempfile.TemporaryDirectory(prefix="unpolled-cpu-repo-") as repo:
        repository = render_cpu_repository(
            Path(repo), demo_model_dir(), ENGINE_CONFIG, cancellation_check_period_ms=NO_POLL_MS
        )
        process = start_local_triton(repository)
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture
async def upstream(unpolled_triton: TritonProcess) -> AsyncIterator[TritonUpstream]:
    # end_id -1: the request would run its full 1500 tokens unless it is stopped.
    up = TritonUpstream("unpolled", unpolled_triton.http_url, unpolled_triton.metrics_url, end_id=-1)
    yield up
    await up.aclose()


async def _running_then_idle(upstream: TritonUpstream, before: TrtLlmMetrics) -> TrtLlmMetrics:
    last = await upstream.metrics()
    with anyio.move_on_after(WAIT_S):
        while not (
            last.active_requests == 0 and last.used_blocks == 0 and last.iterations > before.iterations
        ):
            await anyio.sleep(0.02)
            last = await upstream.metrics()
    assert last.active_requests == 0 and last.used_blocks == 0, f"the sequence is still held: {last}"
    return last


@pytest.mark.anyio
async def test_closing_the_stream_stops_the_sequence_without_the_poll(upstream: TritonUpstream) -> None:
    before = await upstream.metrics()
    stream = upstream.generate(GenerationRequest("close-me", PROMPT, max_new_tokens=1500, temperature=0.0))
    received = 0
    async for delta in stream:
        received += len(delta.token_ids)
        if received >= 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    after = await _running_then_idle(upstream, before)
    # Fewer than the request's 1500 steps: stopped, not run out. By how many fewer is the machine's
    # load: a loaded one ran 643 steps of the tiny model before the stop landed.
    assert after.iterations - before.iterations < 1500


@pytest.mark.anyio
async def test_cancelling_the_reading_task_stops_the_sequence_without_the_poll(
    upstream: TritonUpstream,
) -> None:
    before = await upstream.metrics()
    await cancel_after_first_token(upstream, "cancel-me", WAIT_S)
    after = await _running_then_idle(upstream, before)
    # Fewer than the request's 1500 steps: stopped, not run out. By how many fewer is the machine's
    # load: a loaded one ran 643 steps of the tiny model before the stop landed.
    assert after.iterations - before.iterations < 1500


def _connections_left_after(port: int, timeout_s: float) -> int:
    """Polled, with a deadline: a socket another thread (or library) closes gives no event to wait on."""
    deadline = time.monotonic() + timeout_s
    while (left := established_to(port)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


@pytest.mark.anyio
async def test_a_stream_closed_after_its_upstream_opens_no_new_connection(local_triton: LocalTriton) -> None:
    """At shutdown the upstreams close before the last streams: a stream closed then must not send
    its `stop` on a fresh connection that nobody closes (the model's poll drops the request)."""
    port = int(local_triton.process.http_url.rsplit(":", 1)[1])
    upstream = TritonUpstream("closed-first", local_triton.process.http_url, local_triton.process.metrics_url)
    stream = upstream.generate(GenerationRequest("late-close", PROMPT, max_new_tokens=64, temperature=0.0))
    await stream.__anext__()
    assert established_to(port) >= 1
    await upstream.aclose()

    await stream.aclose()  # type: ignore[attr-defined]
    # Whatever the close started (a stop, before the fix) runs to its end before we look.
    pending = [t for t in asyncio.all_tasks() if t.get_name().startswith("triton-stop-")]
    await asyncio.gather(*pending)
    left = await anyio.to_thread.run_sync(_connections_left_after, port, WAIT_S)
    assert left == 0, "a connection to the replica is still open"


@pytest.mark.anyio
async def test_a_stream_left_before_its_request_reached_the_model_is_stopped_once_it_does(
    unpolled_triton: TritonProcess,
) -> None:
    """A client gone before the first token: the `stop` goes out on a kept-alive connection while
    the request, on a new one, may not have reached the model yet. A stop that overtakes its request
    finds nothing to stop, and the request then ran its whole length (a third to a half of such
    cancels at some timings, measured straight on tritonserver; here made certain by a proxy that
    delivers the request once the stop was answered)."""
    port = int(unpolled_triton.http_url.rsplit(":", 1)[1])
    # Connection 1 is the stream's; the stop opens another.
    with late_request_proxy(port, late=1) as proxy:
        upstream = TritonUpstream(
            "late", f"http://127.0.0.1:{proxy.port}", unpolled_triton.metrics_url, end_id=-1
        )
        try:
            before = await upstream.metrics()
            stream = upstream.generate(
                GenerationRequest("overtaken", PROMPT, max_new_tokens=1500, temperature=0.0)
            )
            first = asyncio.ensure_future(stream.__anext__())
            assert await anyio.to_thread.run_sync(proxy.held.wait, WAIT_S)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            await stream.aclose()  # type: ignore[attr-defined]

            after = await _running_then_idle(upstream, before)
        finally:
            await upstream.aclose()
    # Stopped once it answered (the second stop's round trip, a few steps of this fast model), not
    # run to its 1,500 tokens.
    assert after.generated_tokens - before.generated_tokens < 500, after

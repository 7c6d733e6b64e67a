"""A network failure before the answer's head (connection refused or reset, a request read and
dropped unanswered) is sent again after a jittered, growing wait, as the OpenAI SDK does
(_calculate_retry_timeout: 0.5 s doubling to 8 s, less up to a quarter), within the deadline. It was
sent again at once: every client of an edge that is restarting, or of a load balancer with no
healthy target, came back in the same instant, and the one retry was spent before anything could
have healed.

The real tests take a port that refuses connections (tests/support/late_listener.py) and open it, in
front of a real edge, as the client logs its retry: the retry's connection is then accepted at once,
so the time from that log line to the accept is the client's wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import anyio
import pytest

from floodgate_client import AsyncClient, Client, Finished
from floodgate_client.retry import Attempts, RetryPolicy
from tests.client.live import SURE_TEXT
from tests.support.late_listener import late_listener
from tests.support.live_server import LiveServer

# The least first wait: 0.5 s less a quarter.
_FIRST_WAIT_MIN_S = 0.375


def edge_port(server: LiveServer) -> int:
    port = urlsplit(server.base_url).port
    assert port is not None
    return port


class _OnRetryLogged(logging.Handler):
    def __init__(self, action: Callable[[], object]) -> None:
        super().__init__(logging.INFO)
        self._action = action

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("retrying after a network error"):
            self._action()


@contextmanager
def on_network_retry(action: Callable[[], object]) -> Iterator[None]:
    """Run `action` as the client logs that it will send again after a network failure."""
    logger = logging.getLogger("floodgate.client")
    handler = _OnRetryLogged(action)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_wait_doubles_from_half_a_second_to_eight_less_up_to_a_quarter() -> None:
    policy = RetryPolicy(max_retries=2, deadline_s=600.0)
    highest = [policy.network_wait_s(n, elapsed_s=0.0, draw=lambda: 0.0) for n in range(7)]
    lowest = [policy.network_wait_s(n, elapsed_s=0.0, draw=lambda: 1.0) for n in range(7)]
    assert highest == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert lowest == [0.375, 0.75, 1.5, 3.0, 6.0, 6.0, 6.0]


def test_no_network_retry_waits_past_the_deadline() -> None:
    policy = RetryPolicy(max_retries=2, deadline_s=5.0)
    assert policy.network_wait_s(0, elapsed_s=4.0, draw=lambda: 0.0) == 0.5
    assert policy.network_wait_s(0, elapsed_s=4.6, draw=lambda: 0.0) is None


def test_a_network_retry_after_a_refusal_waits_longer_and_is_taken_once() -> None:
    """The wait grows with the retries the request has taken, whichever kind, as the SDK's count."""
    attempts = Attempts(RetryPolicy(max_retries=2, deadline_s=60.0), network_retries=1)
    attempts.begin()
    attempts.begin()  # a refusal's retry
    wait = attempts.network_retry_wait_s()
    assert wait is not None and 0.75 <= wait <= 1.0
    assert attempts.network_retry_wait_s() is None


def test_without_network_retries_nothing_is_waited() -> None:
    attempts = Attempts(RetryPolicy(max_retries=0, deadline_s=60.0), network_retries=0)
    attempts.begin()
    assert attempts.network_retry_wait_s() is None


async def _create_async(base_url: str, key: str) -> str:
    async with AsyncClient(base_url, key) as client:
        return (await client.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=4)).text


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_refused_connection_is_tried_again_after_a_wait(server: LiveServer, kind: str) -> None:
    key = server.keys["paid"]
    logged_at: list[float] = []
    with late_listener(edge_port(server)) as port:

        def open_port() -> None:
            logged_at.append(time.monotonic())
            port.listen()

        with on_network_retry(open_port):
            if kind == "sync":
                with Client(port.base_url, key) as client:
                    text = client.chat.create(**SURE_TEXT, model="floodgate-tiny", max_tokens=4).text
            else:
                text = anyio.run(_create_async, port.base_url, key)
    assert text
    assert len(logged_at) == 1 and len(port.accepted_at) == 1
    waited = port.accepted_at[0] - logged_at[0]
    assert waited >= _FIRST_WAIT_MIN_S, f"sent again {waited:.3f} s after the refusal"


def test_a_cancel_calls_off_a_network_retry_that_waits(server: LiveServer) -> None:
    """The port opens as the retry is logged: a retry that went out would be accepted. The cancel
    right after calls it off instead; the stream ends cancelled, and nothing reached the edge."""
    key = server.keys["paid"]
    events: list[object] = []

    async def main(port_url: str, listen: Callable[[], None]) -> bool:
        retry_waits = anyio.Event()

        def on_retry() -> None:
            listen()
            retry_waits.set()

        async with AsyncClient(port_url, key) as client:
            stream = client.chat.stream(**SURE_TEXT, model="floodgate-tiny", max_tokens=4)

            async def read() -> None:
                events.extend([event async for event in stream])

            with on_network_retry(on_retry):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read)
                    await retry_waits.wait()
                    called_off = await stream.cancel()
            await stream.close()
            return called_off

    with late_listener(edge_port(server)) as port:
        assert anyio.run(main, port.base_url, port.listen)
        assert port.accepted_at == []
    assert len(events) == 1 and isinstance(events[0], Finished) and events[0].cancelled

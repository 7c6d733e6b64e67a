"""One user's requests hold no more of the stream gate (`[server] max_open_streams`) than the
streams that user may run at once: a free user's flood of long prompts, each waiting for an encode
thread before the limiter refuses it for the user's concurrency, took every place of the free share
meanwhile, and every other free user met 429 server_busy at the door."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from edge.encode_queue import encode_queue
from edge.prompt_encoding import INLINE_COST_LIMIT, MESSAGE_COST_CHARS, Messages, runs_inline
from edge.text.chat_template import PromptEnd
from edge.text.model_text import ModelText
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.support.live_server import LiveServer, start_server
from tests.support.redis_server import RedisServer, start_redis

# With the default reserve (0.2): 4 places for free tiers, one user's flood of 4 fills them.
MAX_OPEN_STREAMS = 5
FLOOD = 4
MAX_CONCURRENT = 2
# The longest any answer here may take: a guard against a hang, never what the test waits on.
GUARD_S = 30.0


class _HeldLongPrompts:
    """The model's encode_chat, held inside its thread for every long prompt until `release`."""

    def __init__(self, text: ModelText) -> None:
        self._encode = text.encode_chat
        self._lock = threading.Lock()
        self.entered = 0
        self.release = threading.Event()

    def __call__(self, messages: Messages, scope: str = "", end: PromptEnd = "reply") -> list[int]:
        if not runs_inline(messages):
            with self._lock:
                self.entered += 1
            self.release.wait(GUARD_S)
        return self._encode(messages, scope, end)


def _long_prompt() -> dict[str, object]:
    """Encoded on a worker thread (past INLINE_COST_LIMIT by its message count), short in tokens."""
    filler = [{"role": "user", "content": "hi"}] * (INLINE_COST_LIMIT // MESSAGE_COST_CHARS + 1)
    return {"model": MODEL, "messages": filler, "max_tokens": 1}


def _waiting_for_a_thread(server: LiveServer) -> int:
    """The prompts waiting in the server's encode queue, read on its loop (the queue is the loop's)."""

    async def count() -> int:
        return sum(1 for entry in encode_queue()._waiting if not entry[-1].done())

    loop = server._server.loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(count(), loop).result(GUARD_S)


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


def test_one_free_users_flood_of_long_prompts_leaves_the_free_share_to_other_free_users(
    tmp_path: Path, redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = ROOMY_TIERS["free"] | {"max_concurrent": MAX_CONCURRENT, "max_queue_wait_s": GUARD_S}
    overrides = {
        "limiter": {"backend": "redis", "redis_url": redis.url, "timeout_ms": 2000},
        "tiers": {"free": free, "paid": ROOMY_TIERS["paid"]},
        "server": {"max_open_streams": MAX_OPEN_STREAMS},
    }
    with start_server(tmp_path, overrides) as server, ThreadPoolExecutor(FLOOD) as pool:
        text = server.app.state.runtime.pipeline.text
        held = _HeldLongPrompts(text)
        monkeypatch.setattr(text, "encode_chat", held)
        url, flooder = server.base_url + CHAT, server.auth("free")
        try:
            flood = [
                pool.submit(httpx.post, url, json=_long_prompt(), headers=flooder, timeout=GUARD_S)
                for _ in range(FLOOD)
            ]
            # Every one of them read and waiting for its encoding: encoding on a held thread, or
            # waiting for one.
            wait_until(
                lambda: held.entered + _waiting_for_a_thread(server) == FLOOD,
                timeout_s=GUARD_S,
                what="the flood waiting for its encoding",
            )
            gate = server.app.state.runtime.pipeline.gate
            # The flood holds no more places than the streams its user may run.
            assert gate.open_streams <= MAX_CONCURRENT, gate.open_streams

            short = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            other = httpx.post(url, json=short, headers=server.auth("free2"), timeout=GUARD_S)
            assert other.status_code == 200, other.text
        finally:
            held.release.set()
        answers = [future.result() for future in flood]

        # At most its concurrency's worth of the flood ran; the rest met the limiter's refusal (or
        # the door's, where the places it could take at the limiter were full), never a 5xx.
        statuses = sorted(answer.status_code for answer in answers)
        assert set(statuses) <= {200, 429}, [answer.text for answer in answers]
        wait_until(lambda: gate.open_streams == 0, what="the flood to leave the gate")

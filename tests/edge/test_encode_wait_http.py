"""A long free prompt behind paid long prompts that hold every encode thread (edge/encode_queue.py),
on a real server: it waited, its client sent no byte back, for as long as the paid prompts held the
threads. It is now answered as the admission queue answers a wait too long, at its tier's
max_queue_wait_s: 429 `wait_too_long` with Retry-After, counted, charged nothing, and its prompt is
never encoded. And what a prompt waited for a thread counts against the same bound in the admission
queue: the tier's max wait is the longest before a replica takes the request, not twice that.

The paid prompts are held inside the encode callable itself, on an event the test sets, so the
threads are busy for exactly as long as the test says."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.admission.ticket import Ticket
from edge.encode_queue import encode_queue
from edge.prompt_encoding import INLINE_COST_LIMIT, MESSAGE_COST_CHARS, Messages
from edge.text.chat_template import PromptEnd
from edge.text.model_text import ModelText
from gpu_container.engine.blas_threads import usable_cpus
from limiter.base import Admission
from tests.admission.test_release_kinds_http import HANG, _hanging_replicas
from tests.edge.conftest import ROOMY_TIERS, finished_requests
from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.faults.test_failed_requests_cost_nothing import SHORT
from tests.support.live_server import LiveServer, start_server

FREE_WAIT_S = 0.2
OVERRIDES = {
    "tiers": {"free": ROOMY_TIERS["free"] | {"max_queue_wait_s": FREE_WAIT_S}, "paid": ROOMY_TIERS["paid"]}
}
HOLD, GAVE_UP, AFTER = "hold this prompt", "the prompt that gave up", "a prompt after"
# The longest any answer here may take: a guard against a hang, never what the test waits on.
GUARD_S = 30.0


def _long(first: str, max_tokens: int = 1) -> dict[str, object]:
    """A prompt encoded on a thread (past INLINE_COST_LIMIT by its message count), short in tokens."""
    filler = [{"role": "user", "content": "hi"}] * (INLINE_COST_LIMIT // MESSAGE_COST_CHARS)
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": first}, *filler],
        "max_tokens": max_tokens,
    }


class _HeldEncoding:
    """The model's encode_chat, held inside its thread while it encodes a HOLD prompt, until the
    test sets `release`; the first message of every prompt it encodes, in order."""

    def __init__(self, text: ModelText) -> None:
        self._encode = text.encode_chat
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.encoded: list[str] = []

    def __call__(self, messages: Messages, scope: str = "", end: PromptEnd = "reply") -> list[int]:
        first = messages[0]["content"]
        self.encoded.append(first)
        if first == HOLD:
            self.entered.release()
            self.release.wait(GUARD_S)
        return self._encode(messages, scope, end)


def _rejected(server: LiveServer, code: str, tier: str, status: int = 429) -> float:
    prefix = "floodgate_requests_rejected_total{"
    wanted = (f'code="{code}"', f'status="{status}"', f'tier="{tier}"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in server.metrics_text().splitlines()
        if line.startswith(prefix) and all(label in line for label in wanted)
    )


def test_a_free_prompt_waiting_for_an_encode_thread_is_refused_at_its_max_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = usable_cpus()  # the server's encode queue has as many (edge/encode_queue.py)
    with start_server(tmp_path, OVERRIDES) as server, ThreadPoolExecutor(threads) as pool:
        text = server.app.state.runtime.pipeline.text
        held = _HeldEncoding(text)
        monkeypatch.setattr(text, "encode_chat", held)
        url, paid, free = server.base_url + CHAT, server.auth("paid"), server.auth("free")
        before = _rejected(server, "wait_too_long", "free")
        try:
            holding = [
                pool.submit(httpx.post, url, json=_long(HOLD), headers=paid, timeout=GUARD_S)
                for _ in range(threads)
            ]
            for _ in range(threads):
                assert held.entered.acquire(timeout=GUARD_S), "the paid prompts never held the threads"
            # Every thread held: before the fix this waited until the guard, for the threads to free.
            refused = httpx.post(url, json=_long(GAVE_UP), headers=free, timeout=GUARD_S)
        finally:
            held.release.set()
        served = [future.result() for future in holding]
        after = httpx.post(url, json=_long(AFTER), headers=free, timeout=GUARD_S)
        rejected = _rejected(server, "wait_too_long", "free") - before
        limit = server.settings.tiers["free"].requests_per_window

    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "wait_too_long"
    assert refused.json()["error"]["type"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1 and int(refused.headers["retry-after-ms"]) > 0
    assert refused.headers["x-request-id"].startswith("chatcmpl-")
    assert rejected == 1
    assert [answer.status_code for answer in served] == [200] * threads, [a.text for a in served]
    # The threads it waited for went to the paid prompts and the next one; it was never encoded.
    assert GAVE_UP not in held.encoded and held.encoded[-1] == AFTER, held.encoded
    # The limiter never saw it: the free user's next request is the first it charged.
    assert after.status_code == 200, after.text
    assert after.headers["x-ratelimit-remaining-requests"] == str(limit - 1)


def _waiting_for_a_thread(server: LiveServer) -> int:
    """The prompts waiting in the server's encode queue, read on its loop (the queue is the loop's)."""

    async def count() -> int:
        return sum(1 for entry in encode_queue()._waiting if not entry[-1].done())

    loop = server._server.loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(count(), loop).result(GUARD_S)


def _queued_tickets(server: LiveServer) -> list[Ticket]:
    return [waiter.ticket for waiter in server.app.state.runtime.pipeline.dispatcher._queue]


def test_the_wait_for_an_encode_thread_counts_against_the_tiers_max_wait_for_a_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free prompt waits for a thread, then for the one sequence a paid stream holds: its ticket
    may wait in the admission queue only what its tier's max wait has left. The paid prompts that
    hold the threads ask for more than their tier allows, a 400 once encoded, so that nothing but
    the free request waits for the replica."""
    overrides = {
        "tiers": ROOMY_TIERS,
        "engine": {"max_num_seqs": 1},
        "admission": {"reserved_paid_fraction": 0.0},
    }
    threads = usable_cpus()
    with (
        start_server(tmp_path, overrides, _hanging_replicas) as server,
        ThreadPoolExecutor(threads + 1) as pool,
        httpx.Client(base_url=server.base_url, timeout=GUARD_S) as client,
    ):
        text = server.app.state.runtime.pipeline.text
        held = _HeldEncoding(text)
        monkeypatch.setattr(text, "encode_chat", held)
        too_many = server.settings.tiers["paid"].max_tokens + 1
        free_wait_s = server.settings.tiers["free"].max_queue_wait_s
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        url, paid, free = server.base_url + CHAT, server.auth("paid"), server.auth("free")
        hang = SHORT | {"max_tokens": HANG, "stream": True}
        with client.stream("POST", CHAT, json=hang, headers=paid):
            wait_until(
                lambda: sum(r.sequences for r in dispatcher.replicas.members) == 1, what="the replica held"
            )
            try:
                holding = [
                    pool.submit(httpx.post, url, json=_long(HOLD, too_many), headers=paid, timeout=GUARD_S)
                    for _ in range(threads)
                ]
                for _ in range(threads):
                    assert held.entered.acquire(timeout=GUARD_S), "the paid prompts never held the threads"
                waiting = pool.submit(httpx.post, url, json=_long(AFTER), headers=free, timeout=GUARD_S)
                wait_until(
                    lambda: _waiting_for_a_thread(server) == 1, what="the free prompt waiting for a thread"
                )
            finally:
                held.release.set()
            wait_until(lambda: dispatcher.queue_depth() == 1, what="the free request waiting for the replica")
            (ticket,) = _queued_tickets(server)
        refused = [future.result() for future in holding]
        served = waiting.result()

    assert [answer.status_code for answer in refused] == [400] * threads, [a.text for a in refused]
    assert served.status_code == 200, served.text
    assert ticket.user == "free-user"
    assert 0 < ticket.max_wait_s < free_wait_s


class _AskedLimiter:
    """The server's own limiter, noting whose admits it was asked for."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.asked: list[str] = []

    async def admit(self, user: str, *args: Any, **kwargs: Any) -> Admission:
        self.asked.append(user)
        admission: Admission = await self._real.admit(user, *args, **kwargs)
        return admission

    async def aclose(self) -> None:
        await self._real.aclose()


def _send_raw(server: LiveServer, body: dict[str, object], who: str) -> socket.socket:
    """A whole chat request sent on a socket of the test's own, which it can close while the
    request waits (an httpx client cut by its timeout does just that)."""
    request = httpx.Request("POST", server.base_url + CHAT, json=body, headers=server.auth(who))
    content = request.read()
    head = "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
    sock = socket.create_connection((request.url.host, request.url.port or 80), timeout=GUARD_S)
    sock.sendall(f"POST {CHAT} HTTP/1.1\r\n{head}\r\n".encode() + content)
    return sock


def _connected(server: LiveServer, port: int) -> bool:
    """Whether the server still holds the connection from the client's `port`, read on its loop: by
    then the callback that dropped it (connection_lost, the disconnect watches' with it) has run."""

    async def held() -> bool:
        connections = server._server.server_state.connections
        clients = (getattr(connection, "client", None) for connection in connections)
        return any(client is not None and client[1] == port for client in clients)

    loop = server._server.loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(held(), loop).result(GUARD_S)


def test_a_client_that_leaves_while_its_prompt_waits_for_an_encode_thread_costs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free long prompt waits for a thread behind paid ones; its client hangs up. It waited on
    unnoticed: when a thread freed its prompt was encoded for nobody and the limiter asked, and it
    ended only when its response began, found its client gone (`disconnected`). It is now let go
    the moment its client goes: never encoded, the limiter never asked, counted as a client's
    499 `client_closed_request` before admission."""
    threads = usable_cpus()
    with start_server(tmp_path, {"tiers": ROOMY_TIERS}) as server, ThreadPoolExecutor(threads) as pool:
        pipeline = server.app.state.runtime.pipeline
        held = _HeldEncoding(pipeline.text)
        monkeypatch.setattr(pipeline.text, "encode_chat", held)
        limiter = _AskedLimiter(pipeline.limiter)
        monkeypatch.setattr(pipeline, "limiter", limiter)
        url, paid, free = server.base_url + CHAT, server.auth("paid"), server.auth("free")
        left_before = _rejected(server, "client_closed_request", "free", 499)
        cut_before = finished_requests(server, "disconnected", "free")

        def ended() -> float:
            """The leaving request's end, however it ended: let go, or cut once its response began."""
            left = _rejected(server, "client_closed_request", "free", 499) - left_before
            return left + finished_requests(server, "disconnected", "free") - cut_before

        try:
            holding = [
                pool.submit(httpx.post, url, json=_long(HOLD), headers=paid, timeout=GUARD_S)
                for _ in range(threads)
            ]
            for _ in range(threads):
                assert held.entered.acquire(timeout=GUARD_S), "the paid prompts never held the threads"
            leaving = _send_raw(server, _long(GAVE_UP), "free")
            port = leaving.getsockname()[1]
            wait_until(
                lambda: _waiting_for_a_thread(server) == 1, what="the free prompt waiting for a thread"
            )
            leaving.close()
            wait_until(lambda: not _connected(server, port), what="the server to see the client leave")
        finally:
            held.release.set()
        served = [future.result() for future in holding]
        wait_until(lambda: ended() == 1, what="the leaving request to end")
        after = httpx.post(url, json=_long(AFTER), headers=free, timeout=GUARD_S)
        left = _rejected(server, "client_closed_request", "free", 499) - left_before
        cut = finished_requests(server, "disconnected", "free") - cut_before
        limit = server.settings.tiers["free"].requests_per_window

    assert [answer.status_code for answer in served] == [200] * threads, [a.text for a in served]
    # Let go before admission, as a client that leaves mid-body is: not admitted, then cut.
    assert (left, cut) == (1, 0)
    # The thread it waited for went to the next prompt; it was never encoded.
    assert GAVE_UP not in held.encoded and held.encoded[-1] == AFTER, held.encoded
    # The limiter was never asked for it: the free user's next request is the first it saw.
    assert limiter.asked.count("free-user") == 1, limiter.asked
    assert after.status_code == 200, after.text
    assert after.headers["x-ratelimit-remaining-requests"] == str(limit - 1)


FLOOD, OTHER = "one of the flood", "another user's prompt"
# The free tier waiting longer than any answer here takes: the encodings' order is under test, not
# the bound.
WAITING = {"tiers": {"free": ROOMY_TIERS["free"] | {"max_queue_wait_s": GUARD_S}}}


def test_one_free_users_flood_of_long_prompts_does_not_hold_another_free_users_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One free user's long prompts hold every encode thread and ten times as many wait; another
    free user's long prompt then takes the next thread that frees. First come first served within
    the tier, it waited for the whole flood's encoding (before the limiter, which refuses most of
    the flood for its concurrency, and before the fair admission queue had seen its request)."""
    threads = usable_cpus()
    flood = 10 * threads
    with start_server(tmp_path, WAITING) as server, ThreadPoolExecutor(threads + flood + 1) as pool:
        text = server.app.state.runtime.pipeline.text
        held = _HeldEncoding(text)
        monkeypatch.setattr(text, "encode_chat", held)
        url, free, free2 = server.base_url + CHAT, server.auth("free"), server.auth("free2")
        try:
            holding = [
                pool.submit(httpx.post, url, json=_long(HOLD), headers=free, timeout=GUARD_S)
                for _ in range(threads)
            ]
            for _ in range(threads):
                assert held.entered.acquire(timeout=GUARD_S), "the flood never held the threads"
            flooding = [
                pool.submit(httpx.post, url, json=_long(FLOOD), headers=free, timeout=GUARD_S)
                for _ in range(flood)
            ]
            wait_until(lambda: _waiting_for_a_thread(server) == flood, what="the flood waiting for a thread")
            other = pool.submit(httpx.post, url, json=_long(OTHER), headers=free2, timeout=GUARD_S)
            wait_until(lambda: _waiting_for_a_thread(server) == flood + 1, what="the other prompt waiting")
        finally:
            held.release.set()
        for future in [*holding, *flooding, other]:
            future.result()

    # The threads that freed went to the other user's prompt first, not after the flood's (a few of
    # the flood's may be encoded beside it, on the other threads, before its thread writes it down).
    assert OTHER in held.encoded[: 4 * threads], held.encoded

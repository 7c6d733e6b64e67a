"""The stream gate keeps the paid reserve: a free flood that holds the free share of a process's
streams (`[server] max_open_streams`) leaves the rest to paid users, instead of a paid user meeting
429 server_busy at the door while free streams hold every place."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from edge.config import Settings
from edge.prompt_encoding import runs_inline
from edge.upstreams.base import Capacity, Delta, GenerationRequest, Upstream
from tests.edge.conftest import ROOMY_TIERS
from tests.edge.sse_client import CHAT, DONE, MODEL, content_of, events, wait_until
from tests.support.live_server import LiveServer, start_server

MAX_OPEN_STREAMS = 5  # with the default reserve (0.2): 4 for free tiers


class HeldUpstream:
    """Streams one token, then holds every stream until `release()`."""

    name = "held"

    def __init__(self, kv_tokens_total: int = 100_000) -> None:
        self.kv_tokens_total = kv_tokens_total
        self._loop: asyncio.AbstractEventLoop | None = None
        self._released: asyncio.Event | None = None

    def generate(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate()

    async def _generate(self) -> AsyncIterator[Delta]:
        if self._released is None:
            self._loop, self._released = asyncio.get_running_loop(), asyncio.Event()
        yield Delta([300], None)
        await self._released.wait()
        yield Delta([301], "length")

    def release(self) -> None:
        """From the test's thread."""
        assert self._loop is not None and self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    async def capacity(self) -> Capacity:
        return Capacity(self.kv_tokens_total, 0, 64, 0, 0, 16)

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def _held_server(tmp_path: Path, upstream: HeldUpstream) -> LiveServer:
    def provider(settings: Settings, model_dir: Path) -> Any:
        @asynccontextmanager
        async def provide() -> AsyncIterator[list[Upstream]]:
            yield [upstream]

        return provide()

    overrides = {"tiers": ROOMY_TIERS, "server": {"max_open_streams": MAX_OPEN_STREAMS}}
    return start_server(tmp_path, overrides, provider)


BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}


def _open(stack: ExitStack, server: LiveServer, who: str) -> tuple[httpx.Response, Iterator[Any]]:
    """A stream opened and read to its first token, or a refusal read whole."""
    client = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=30.0))
    response = stack.enter_context(client.stream("POST", CHAT, json=BODY, headers=server.auth(who)))
    if response.status_code != 200:
        response.read()
        return response, iter(())
    reader = events(response)
    for chunk in reader:
        if isinstance(chunk, dict) and content_of([chunk]):
            break
    return response, reader


def _reserve_refusals(server: LiveServer) -> float:
    for line in server.metrics_text().splitlines():
        if line.startswith("floodgate_stream_reserve_refusals_total "):
            return float(line.split()[1])
    raise AssertionError("no floodgate_stream_reserve_refusals_total on /metrics")


def _busy(response: httpx.Response) -> bool:
    return (
        response.status_code == 429
        and response.json()["error"]["code"] == "server_busy"
        and float(response.headers["retry-after"]) >= 1
    )


def test_a_free_flood_leaves_the_paid_share_of_the_streams(tmp_path: Path) -> None:
    upstream = HeldUpstream()
    with _held_server(tmp_path, upstream) as server, ExitStack() as stack:
        held = [_open(stack, server, who) for who in ("free", "free2", "free", "free2")]
        assert all(response.status_code == 200 for response, _ in held)

        # The free share (4 of 5) is full: free is refused, paid still gets the fifth.
        kept_before = _reserve_refusals(server)
        refused_free, _ = _open(stack, server, "free")
        assert _busy(refused_free), refused_free.status_code
        assert _reserve_refusals(server) == kept_before + 1
        # A bad request still gets its own answer, not a 429 the SDK would retry.
        with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
            unknown = client.post(CHAT, json=BODY | {"model": "no-such-model"}, headers=server.auth("free"))
            too_long = client.post(CHAT, json=BODY | {"max_tokens": 10**6}, headers=server.auth("free"))
        assert (unknown.status_code, too_long.status_code) == (404, 400), (unknown.text, too_long.text)
        paid = _open(stack, server, "paid")
        assert paid[0].status_code == 200
        # Now the door itself is full, for everyone.
        refused_paid, _ = _open(stack, server, "paid")
        assert _busy(refused_paid), refused_paid.status_code

        upstream.release()
        for response, reader in [*held, paid]:
            assert list(reader)[-1] == DONE, response
        # Once they have left the door, the free share is open again.
        gate = server.app.state.runtime.pipeline.gate
        wait_until(lambda: gate.open_streams == 0, what="the streams to leave the gate")
        again = _open(stack, server, "free")
        assert again[0].status_code == 200
        assert list(again[1])[-1] == DONE


def test_a_free_request_no_replica_could_ever_hold_is_a_400_while_the_free_share_is_full(
    tmp_path: Path,
) -> None:
    """The free share of the door full, a free request past the free tier's part of every replica:
    it was answered 429 server_busy, a "try again shortly" the SDK obeys, and every retry met the
    same full share or, once in, the 400 it should have had at once. The 400 comes first; a free
    request that fits is still kept from the paid share."""
    # 256 KV tokens a replica, the free tiers' part 192 (reserve 0.2, whole blocks of 16): the
    # held streams take a few dozen each, the long one (its prompt plus a margin of 256) none.
    upstream = HeldUpstream(kv_tokens_total=256)
    with _held_server(tmp_path, upstream) as server, ExitStack() as stack:
        held = [_open(stack, server, who) for who in ("free", "free2", "free", "free2")]
        assert all(response.status_code == 200 for response, _ in held)

        with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
            never = client.post(CHAT, json=BODY | {"max_tokens": 300}, headers=server.auth("free"))
        assert never.status_code == 400, never.text
        assert never.json()["error"]["code"] == "context_length_exceeded"
        assert "retry-after" not in never.headers
        refused_free, _ = _open(stack, server, "free")
        assert _busy(refused_free), refused_free.status_code

        upstream.release()
        for response, reader in held:
            assert list(reader)[-1] == DONE, response


def _send_headers_and_part_of_the_body(server: LiveServer, who: str) -> socket.socket:
    """A chat request whose body stops after its first byte (a slow or stalled client)."""
    body = json.dumps(BODY).encode()
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30.0)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {server.keys[who]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[:1])
    return sock


def test_requests_still_sending_their_bodies_hold_no_stream(tmp_path: Path) -> None:
    """Requests whose bodies trickle in (until body_timeout_s) are no generations yet: a free key's
    must neither fill the door for everyone nor pass the paid reserve, which is only checked once a
    body has been read."""
    upstream = HeldUpstream()
    with _held_server(tmp_path, upstream) as server, ExitStack() as stack:
        slow = [
            stack.enter_context(_send_headers_and_part_of_the_body(server, who))
            for who in ("free", "free2", "free", "paid", "paid")
        ]
        # Every one of them has reached the app (the server runs one task per request).
        tasks = server._server.server_state.tasks
        wait_until(lambda: len(tasks) == len(slow), what="the slow requests to reach the app")

        paid, reader = _open(stack, server, "paid")
        assert paid.status_code == 200, paid.read()
        free, _ = _open(stack, server, "free")
        assert free.status_code == 200, free.read()

        # Their bodies end now, one after the other, all past the door: the reserve and the cap
        # hold as they arrive (two places left for free streams, then the reserve's, then none).
        rest = json.dumps(BODY).encode()[1:]
        statuses = []
        for sock in slow:
            sock.sendall(rest)
            statuses.append(int(sock.recv(64).split(b" ", 2)[1]))
        assert statuses == [200, 200, 429, 200, 429], statuses
        gate = server.app.state.runtime.pipeline.gate
        assert gate.open_streams == MAX_OPEN_STREAMS

        upstream.release()
        assert list(reader)[-1] == DONE


class HeldEncoding:
    """The pipeline's own prompt encoding, held for long prompts (those it encodes in a worker
    thread) until `release()`: a long prompt's encoding, as a free flood's large bodies make it, for
    as long as the test needs."""

    def __init__(self, encode_chat: Any) -> None:
        self._encode_chat = encode_chat
        self.entered = threading.Event()
        self._released = threading.Event()

    def __call__(self, messages: Any, scope: str = "", end: Any = "reply") -> list[int]:
        if not runs_inline(messages):
            self.entered.set()
            assert self._released.wait(30.0), "the held encoding was never released"
        return self._encode_chat(messages, scope, end)

    def release(self) -> None:
        self._released.set()


def test_a_free_request_being_read_past_the_free_share_holds_no_paid_place(tmp_path: Path) -> None:
    """A free request counted at its body's end was checked against the free share only after its
    prompt was encoded (a worker thread's wait for a long one, behind every other such prompt):
    meanwhile it held one of the places kept for paid users, and a free flood of long prompts (one
    key's, past its concurrency limit, which is checked later still) filled the door: paid users
    met 429 server_busy. Past the free share, a free request now takes no place: it is refused once
    it has been validated, as before."""
    upstream = HeldUpstream()
    with _held_server(tmp_path, upstream) as server, ExitStack() as stack:
        held = [_open(stack, server, who) for who in ("free", "free2", "free", "free2")]
        assert all(response.status_code == 200 for response, _ in held)
        text = server.app.state.runtime.pipeline.text
        encoding = HeldEncoding(text.encode_chat)
        text.encode_chat = encoding
        long_body = BODY | {"messages": [{"role": "user", "content": "word " * 1_000}]}
        late: list[httpx.Response] = []

        def send_long() -> None:
            with httpx.Client(base_url=server.base_url, timeout=30.0) as client:
                response = client.post(CHAT, json=long_body, headers=server.auth("free"))
                response.read()
                late.append(response)

        sender = threading.Thread(target=send_long)
        sender.start()
        gate = server.app.state.runtime.pipeline.gate
        try:
            assert encoding.entered.wait(30.0), "the long prompt never reached its encoding"
            with ExitStack() as paid_stack:
                paid, _ = _open(paid_stack, server, "paid")
                assert paid.status_code == 200, paid.read()
            # The paid stream gone, the free share is exactly full again: the long free request,
            # which holds no place, is still refused (run, it would be a stream nothing counts).
            wait_until(lambda: gate.open_streams == 4, what="the paid stream to leave the gate")
        finally:
            encoding.release()
            sender.join(30.0)
        assert late and _busy(late[0]), late
        assert gate.open_streams == 4
        upstream.release()
        for response, stream in held:
            assert list(stream)[-1] == DONE, response

"""A stream cut by the drain's deadline or by its key's end before any of its text went out (during
its prefill, or after a first token that carries none: a character's first byte) is answered with
an error event alone, as a stream whose replica fails before its first token is, and as the same
request not streamed is: refunded whole (a client retrying the 503, as it invites, would otherwise
pay twice), nothing of it stored. Streamed, it was charged its prompt (two reviews), and after a
textless first token its question was stored with an empty reply. On real servers whose replica
never produces a first token (HANG), or one token, the first byte of a three-byte character
(PARTIAL), then nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.admission.test_release_kinds_http import HANG, _hanging_replicas
from tests.edge.sse_client import CHAT, events, wait_until
from tests.faults.test_failed_requests_cost_nothing import SHORT
from tests.keys.test_key_streams import LONG_TTL_S, _admin, _settings
from tests.support.live_server import LiveServer, start_server
from tests.support.scripted_replicas import scripted_replicas

DRAIN = {"server": {"drain_accept_s": 60.0, "drain_deadline_s": 1.0}}
PARTIAL = 9  # max_tokens the replica below answers with one token carrying no whole character
E2 = 161  # the demo tokenizer's byte-level piece for 0xE2: the first byte of "☃" (E2 98 83)
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def _data(response: httpx.Response) -> list[Any]:
    return [e for e in events(response) if not (isinstance(e, str) and e.startswith(":"))]


def _no_content(stream: list[Any]) -> bool:
    return not any(e["choices"] and e["choices"][0]["delta"].get("content") for e in stream if "choices" in e)


async def _partial(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    """A request for PARTIAL tokens gets one token, E2, and then nothing."""
    if req.max_new_tokens == PARTIAL:
        yield Delta([E2])
        await asyncio.Event().wait()
    async for delta in inner.generate(req):
        yield delta


_partial_replicas = scripted_replicas(_partial)


def _holding(n: int) -> Callable[[Any], bool]:
    """The dispatcher holds n slots (their requests in their prefill)."""
    return lambda dispatcher: len(dispatcher._running) == n


def _with_first_token(n: int) -> Callable[[Any], bool]:
    """The dispatcher holds n slots, each with its first token."""

    def ready(dispatcher: Any) -> bool:
        running = list(dispatcher._running)
        return len(running) == n and all(slot.first_token_at is not None for slot in running)

    return ready


def _drained(
    tmp_path: Path, replicas: Any, ask: dict[str, Any], ready: Callable[[Any], bool]
) -> tuple[httpx.Response, list[Any]]:
    """`ask` not streamed and streamed at once, both cut by the drain's deadline once `ready`: the
    answer not streamed, and the stream's events. A conversation `ask` names is the plain request's;
    the stream's is one of its own (a conversation serves one request at a time)."""
    got: dict[str, Any] = {}
    ask_streamed = ask | STREAM
    if "conversation_id" in ask:
        ask_streamed["conversation_id"] = f"{ask['conversation_id']}-streamed"
    with start_server(tmp_path, DRAIN, replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        auth = server.auth("paid")

        def plain() -> None:
            got["plain"] = httpx.post(server.base_url + CHAT, json=ask, headers=auth, timeout=60.0)

        def streamed() -> None:
            with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
                with client.stream("POST", CHAT, json=ask_streamed, headers=auth) as response:
                    got["stream"] = _data(response)

        threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for thread in threads:
            thread.start()
        wait_until(lambda: ready(dispatcher), what="both requests to be where the drain cuts them")
        server.drain()
        for thread in threads:
            thread.join(60)
    return got["plain"], got["stream"]


def _revoked_mid_stream(edge: LiveServer, body: dict[str, Any], ready: Callable[[Any], bool]) -> list[Any]:
    """A stream of `body` with a new key of its own, the key revoked once `ready`: its events."""
    made = _admin(edge, "", {"user": "kay", "tier": "paid"})
    dispatcher = edge.app.state.runtime.pipeline.dispatcher
    got: list[Any] = []

    def streamed() -> None:
        with httpx.Client(base_url=edge.base_url, timeout=60.0) as client:
            headers = {"Authorization": f"Bearer {made['key']}"}
            with client.stream("POST", CHAT, json=body | STREAM, headers=headers) as response:
                got.extend(_data(response))

    thread = threading.Thread(target=streamed)
    thread.start()
    wait_until(lambda: ready(dispatcher), what="the stream to be where the revocation cuts it")
    _admin(edge, f"/{made['id']}/revoke")
    thread.join(60)
    return got


def test_a_stream_the_drain_cuts_during_its_prefill_costs_what_one_not_streamed_does(tmp_path: Path) -> None:
    ask = SHORT | {"max_tokens": HANG, "conversation_id": "conv-drained"}
    plain, stream = _drained(tmp_path, _hanging_replicas, ask, _holding(2))
    assert plain.status_code == 503, plain.text
    assert plain.json()["error"]["code"] == "server_shutting_down"
    assert stream[-2]["error"]["code"] == "server_shutting_down", stream[-3:]
    assert _no_content(stream[:-2])
    assert stream[-3]["usage"]["prompt_tokens"] == 0, stream[-3]  # refunded whole, as not streamed


def test_a_stream_whose_key_is_revoked_during_its_prefill_is_refunded_as_an_error_alone(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path / "keys.db", LONG_TTL_S)
    with start_server(tmp_path / "edge", settings, _hanging_replicas) as edge:
        body = SHORT | {"max_tokens": HANG, "conversation_id": "conv-revoked"}
        got = _revoked_mid_stream(edge, body, _holding(1))
    assert got[-2]["error"]["code"] == "invalid_api_key", got[-3:]
    assert _no_content(got[:-2])
    assert got[-3]["usage"]["prompt_tokens"] == 0, got[-3]


def test_a_stream_the_drain_cuts_after_a_first_token_without_text_costs_nothing(tmp_path: Path) -> None:
    plain, stream = _drained(
        tmp_path, _partial_replicas, SHORT | {"max_tokens": PARTIAL}, _with_first_token(2)
    )
    assert plain.status_code == 503, plain.text
    assert stream[-2]["error"]["code"] == "server_shutting_down", stream[-3:]
    assert _no_content(stream[:-2])
    assert stream[-3]["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_a_stream_whose_key_is_revoked_after_a_first_token_without_text_stores_no_turn(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path / "keys.db", LONG_TTL_S)
    with start_server(tmp_path / "edge", settings, _partial_replicas) as edge:
        kept = {"Authorization": f"Bearer {_admin(edge, '', {'user': 'kay', 'tier': 'paid'})['key']}"}
        body = SHORT | {"max_tokens": PARTIAL, "conversation_id": "conv-textless"}
        got = _revoked_mid_stream(edge, body, _with_first_token(1))
        with httpx.Client(base_url=edge.base_url, timeout=60.0, headers=kept) as client:
            marker = SHORT | {"conversation_id": "conv-textless-marker"}
            assert client.post(CHAT, json=marker).status_code == 200
            history = "/v1/conversations/{}/messages"
            wait_until(
                lambda: client.get(history.format("conv-textless-marker")).status_code == 200,
                what="the marker's turns",
            )
            textless = client.get(history.format("conv-textless"))
    assert got[-2]["error"]["code"] == "invalid_api_key", got[-3:]
    assert _no_content(got[:-2])
    assert got[-3]["usage"]["prompt_tokens"] == 0, got[-3]
    assert textless.status_code == 404, textless.text  # no turn of it stored

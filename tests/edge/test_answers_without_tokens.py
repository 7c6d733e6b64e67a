"""Answers that end without a first token, on a real server: a reply of no tokens, and a request
cancelled during its prefill. Both are answers (charged, ended as replies end), streamed or not.

A reply of no tokens is a legitimate answer on the Triton path: TensorRT-LLM leaves the end token out
of its output, so a reply whose first token is the end token arrives as one final Delta([], "stop")
(edge/upstreams/triton.py; the first test pins that). Released before any token, its slot taught the
queue nothing, as a cancel's does; and a stream's question, stored at its first token, was never
stored for either, nor their replies, where the same requests not streamed store both (a review)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from edge.upstreams.base import Delta, GenerationRequest, Upstream
from tests.admission.test_release_kinds_http import HANG, _hanging_replicas
from tests.edge.sse_client import CHAT, MODEL, wait_until
from tests.support.live_server import start_server
from tests.support.scripted_replicas import scripted_replicas
from tests.triton.test_sse_wire import END, HEAD, FakeReplica, _tokens, chunk

EMPTY = 6  # max_tokens that the replica below answers with no token (its first was the end token)
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": EMPTY}


@pytest.mark.anyio
async def test_premise_triton_answers_a_reply_whose_first_token_is_the_end_token_with_no_token() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(
            HEAD + chunk(b'data: {"model_name":"tensorrt_llm","output_ids":[],"sequence_length":0}\n\n') + END
        )
        await writer.drain()

    async with FakeReplica(answer) as replica, replica.upstream() as upstream:
        req = GenerationRequest("r", [5, 6, 7], max_new_tokens=EMPTY, temperature=0.0)
        assert await _tokens(upstream.generate(req)) == ([], "stop")


async def _empty(inner: Upstream, req: GenerationRequest) -> AsyncIterator[Delta]:
    """A request for EMPTY tokens is answered as TensorRT-LLM answers one whose first token is the
    end token: Delta([], "stop")."""
    if req.max_new_tokens == EMPTY:
        await asyncio.sleep(0.05)  # its prefill and one step
        yield Delta([], "stop")
        return
    async for delta in inner.generate(req):
        yield delta


_empty_replicas = scripted_replicas(_empty)


def _turns(client: httpx.Client, cid: str) -> list[tuple[str, str, str | None]]:
    answer = client.get(f"/v1/conversations/{cid}/messages")
    data = answer.json()["data"] if answer.is_success else []
    return [(m["role"], m["content"], m["finish_reason"]) for m in data]


def _marker(client: httpx.Client, name: str) -> None:
    """Turns stored after whatever earlier requests stored (one writer, in order)."""
    marker = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert client.post(CHAT, json=marker | {"conversation_id": name}).status_code == 200
    wait_until(lambda: len(_turns(client, name)) == 2, what="the marker's turns")


def test_a_reply_of_no_tokens_is_a_generation_that_ran(tmp_path: Path) -> None:
    """A service time for its replica and a reply length (0) for its user: the replica ran it to
    its end and the client got it."""
    with start_server(tmp_path, None, _empty_replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            answer = client.post(CHAT, json=ASK)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["finish_reason"] == "stop"
        assert answer.json()["usage"]["prompt_tokens"] > 0  # charged as answered
        learnt = (
            [r.rate.samples for r in dispatcher.replicas.members],
            "paid-user" in dict(dispatcher._reply_lengths._by_user),
        )
        assert learnt == ([1], True)


def test_a_streamed_reply_of_no_tokens_stores_its_turn_as_one_not_streamed_does(tmp_path: Path) -> None:
    """Not streamed, both turns are stored; streamed too."""
    with start_server(tmp_path, None, _empty_replicas) as server:
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            plain = client.post(CHAT, json=ASK | {"conversation_id": "conv-plain"})
            assert plain.status_code == 200, plain.text
            with client.stream(
                "POST", CHAT, json=ASK | {"conversation_id": "conv-stream", "stream": True}
            ) as s:
                lines = [line for line in s.iter_lines() if line.startswith("data: ")]
            assert '"finish_reason":"stop"' in "".join(lines), lines
            _marker(client, "conv-no-token-marker")
            stored = (_turns(client, "conv-plain"), _turns(client, "conv-stream"))
    assert stored[0] == [("user", "hi", None), ("assistant", "", "stop")]
    assert stored[1] == stored[0]


def test_a_stream_cancelled_during_its_prefill_stores_its_turn_as_one_not_streamed_does(
    tmp_path: Path,
) -> None:
    """Cancelled before its first token, the request's answer is its (empty) cancelled reply,
    charged: not streamed it stores the question and that reply; streamed, the same."""
    hang = ASK | {"max_tokens": HANG}
    with start_server(tmp_path, None, _hanging_replicas) as server:
        dispatcher = server.app.state.runtime.pipeline.dispatcher
        with httpx.Client(base_url=server.base_url, timeout=60.0, headers=server.auth("paid")) as client:
            # Not streamed: its id is learnt from the slot it holds.
            answers: list[httpx.Response] = []
            thread = threading.Thread(
                target=lambda: answers.append(
                    client.post(CHAT, json=hang | {"conversation_id": "conv-c-plain"})
                )
            )
            thread.start()
            wait_until(lambda: len(dispatcher._running) == 1, what="the request to hold a slot")
            rid = next(iter(list(dispatcher._running))).ticket.request_id
            assert client.post(f"{CHAT}/{rid}/cancel").status_code == 200
            thread.join(30)
            assert answers and answers[0].status_code == 200, answers
            assert answers[0].json()["floodgate"] == {"cancelled": True}
            with client.stream(
                "POST", CHAT, json=hang | {"conversation_id": "conv-c-stream", "stream": True}
            ) as streamed:
                lines = streamed.iter_lines()
                first = next(line for line in lines if line.startswith("data: {"))
                sid = json.loads(first.removeprefix("data: "))["id"]
                wait_until(lambda: len(dispatcher._running) == 1, what="the stream to hold a slot")
                assert client.post(f"{CHAT}/{sid}/cancel").status_code == 200
                rest = list(lines)
            assert any('"cancelled"' in line for line in rest), rest
            _marker(client, "conv-cancel-marker")
            stored = (_turns(client, "conv-c-plain"), _turns(client, "conv-c-stream"))
    assert stored[0] == [("user", "hi", None), ("assistant", "", "cancelled")]
    assert stored[1] == stored[0]

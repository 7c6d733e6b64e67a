"""Named conversations are stored off the hot path; a replica dying mid-stream ends the stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from edge.upstreams.local import LocalUpstream
from tests.edge.sse_client import CHAT, DONE, MODEL, content_of, events, wait_until
from tests.support.live_server import LiveServer, start_server


def test_a_named_conversation_is_stored_for_its_owner_only(server: LiveServer, client: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "remember me"}],
        "max_tokens": 6,
        "stream": True,
        "conversation_id": "conv-edge-1",
    }
    with client.stream("POST", CHAT, json=body, headers=server.auth("free")) as response:
        reply = content_of(list(events(response)))
        rid = response.headers["x-request-id"]
    url = "/v1/conversations/conv-edge-1/messages"

    def stored() -> bool:
        answer = client.get(url, headers=server.auth("free"))
        return answer.status_code == 200 and len(answer.json()["data"]) == 2

    wait_until(stored, what="the message writer to store the turn")
    data = client.get(url, headers=server.auth("free")).json()["data"]
    assert [(m["role"], m["content"]) for m in data] == [("user", "remember me"), ("assistant", reply)]
    assert {m["request_id"] for m in data} == {rid}
    assert client.get(url, headers=server.auth("free2")).status_code == 404


def test_the_prompt_is_stored_before_the_reply_ends_and_a_cancelled_reply_is_kept(
    server: LiveServer, client: httpx.Client, long_body: dict[str, Any]
) -> None:
    body = long_body | {
        "messages": [{"role": "system", "content": "be brief"}, *long_body["messages"]],
        "conversation_id": "conv-edge-partial",
    }
    url = "/v1/conversations/conv-edge-partial/messages"

    def history(who: str) -> list[tuple[str, str | None]]:
        answer = client.get(url, headers=server.auth(who))
        return [(m["role"], m["finish_reason"]) for m in answer.json()["data"]] if answer.is_success else []

    with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
        stream = events(response)
        rid = next(stream)["request_id"]
        # Stored while the reply is still streaming: an edge dying now keeps the user's message.
        wait_until(lambda: history("paid") == [("user", None)], what="the prompt to be stored")
        assert client.post(f"{CHAT}/{rid}/cancel", headers=server.auth("paid")).status_code == 200
        reply = content_of(list(stream))

    wait_until(lambda: len(history("paid")) == 2, what="the partial reply to be stored")
    data = client.get(url, headers=server.auth("paid")).json()["data"]
    assert [(m["role"], m["content"], m["finish_reason"]) for m in data] == [
        ("user", long_body["messages"][-1]["content"], None),
        ("assistant", reply, "cancelled"),
    ]
    assert client.get(url, headers=server.auth("free")).status_code == 404


def test_replica_failure_mid_stream_ends_with_an_error_event(
    tmp_path: Path, long_body: dict[str, Any]
) -> None:
    body = long_body
    with start_server(tmp_path) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        with client.stream("POST", CHAT, json=body, headers=server.auth("paid")) as response:
            stream = events(response)
            next(stream)
            assert next(stream)["choices"][0]["delta"]["content"] is not None
            upstream = server.app.state.runtime.upstreams[0]
            assert isinstance(upstream, LocalUpstream)
            upstream.engine.engine.stop()  # the replica goes away with the sequence running
            rest = list(stream)
    assert rest[-1] == DONE
    error = rest[-2]["error"]
    assert error["code"] == "upstream_error" and error["type"] == "api_error"
    assert not any(isinstance(e, dict) and e.get("choices", [{}])[0].get("finish_reason") for e in rest[:-2])

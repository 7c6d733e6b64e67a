"""A conversation that moves from model to model: its history says which model wrote each reply."""

from __future__ import annotations

import uuid

import httpx

from tests.edge.sse_client import CHAT, DONE, events
from tests.models.conftest import LARGE, SMALL
from tests.support.live_server import LiveServer


def test_the_history_says_which_model_wrote_each_reply(two_models: LiveServer) -> None:
    """The stored turns kept no model: a client reading back a conversation answered by `small`
    and then by `large` could not tell which said what. Each reply now names its model, as the
    answer itself did; a user's turn names none."""
    conv = f"models-{uuid.uuid4().hex[:8]}"
    auth = two_models.auth("paid")
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "conversation_id": conv}
    with httpx.Client(base_url=two_models.base_url, timeout=60) as client:
        answered = client.post(CHAT, json=ask | {"model": SMALL}, headers=auth)
        assert answered.status_code == 200, answered.text
        with client.stream(
            "POST", CHAT, json=ask | {"model": LARGE, "stream": True}, headers=auth
        ) as streamed:
            assert list(events(streamed))[-1] == DONE
        history = client.get(f"/v1/conversations/{conv}/messages", headers=auth)
    assert history.status_code == 200, history.text
    assert [(m["role"], m["model"]) for m in history.json()["data"]] == [
        ("user", None),
        ("assistant", SMALL),
        ("user", None),
        ("assistant", LARGE),
    ]

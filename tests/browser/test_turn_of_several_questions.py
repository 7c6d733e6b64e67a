"""A stored turn of several user messages, read back by the playground in a real browser. The edge
stores every user message after the assistant's last as the turn's questions (a question sent in two
parts, two participants of a group chat), each with the reply's request id, then the reply. The page
paired each user message with the message right after it: a turn's first question, followed by the
second rather than by a reply, was shown as failed ("no reply stored") and left out of the context
the next turn sent. A turn's questions are now those of its request id; a question whose request
stored no reply (an edge that died mid-stream) is still a failed turn."""

from __future__ import annotations

import json

import httpx
from playwright.sync_api import Browser, Page, expect

from edge.routes.playground import PLAYGROUND
from tests.browser.conftest import SMALL, WAIT_MS, fresh_key
from tests.browser.test_reload_keeps_the_conversation import sent_messages
from tests.client.scripted_edge import ScriptedEdge, served
from tests.support.live_server import LiveServer

TWO_PARTS = [
    {"role": "user", "content": "I am going to Lima.", "name": "alice"},
    {"role": "user", "content": "What should I pack?", "name": "bob"},
]


def open_conversation(page: Page, base_url: str, conversation_id: str, key: str) -> None:
    """The playground at `base_url`, its tab's conversation `conversation_id`, read back with `key`."""
    page.goto(base_url + "/")
    page.evaluate(f"sessionStorage.setItem('floodgate.conversationId', {conversation_id!r})")
    page.reload()
    page.fill("#api-key", key)
    page.dispatch_event("#api-key", "change")


def test_a_turn_of_two_questions_reads_back_as_one_answered_turn(page: Page, page_server: LiveServer) -> None:
    key = fresh_key(page_server, "paid", "two-questions")
    conversation = "c-two-questions"
    body = {"model": SMALL, "messages": TWO_PARTS, "max_tokens": 4, "conversation_id": conversation}
    with httpx.Client(base_url=page_server.base_url, timeout=30.0) as client:
        answer = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    reply = answer.json()["choices"][0]["message"]["content"]

    open_conversation(page, page_server.base_url, conversation, key)

    expect(page.locator("#transcript .msg")).to_have_text(
        ["I am going to Lima.", "What should I pack?", reply], timeout=WAIT_MS
    )
    expect(page.locator("#transcript .msg.failed")).to_have_count(0)
    expect(page.locator("#transcript .fail-note")).to_have_count(0)
    expect(page.locator("#prompt")).to_have_value("")
    page.fill("#max-tokens", "4")
    sent = sent_messages(page, "and the weather?")
    assert sent == [
        {"role": "user", "content": "I am going to Lima.", "name": "alice"},
        {"role": "user", "content": "What should I pack?", "name": "bob"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and the weather?"},
    ]


def stored(number: int, role: str, content: str, request_id: str, finish: str | None) -> dict[str, object]:
    """A message as GET /v1/conversations/{id}/messages gives it."""
    return {"id": f"01J{number:023d}", "role": role, "content": content, "name": None,
            "request_id": request_id, "finish_reason": finish}  # fmt: skip


def test_questions_with_no_reply_stored_are_still_failed_turns(browser: Browser) -> None:
    """Scripted (an edge that dies mid-stream leaves its questions with no reply): a question whose
    request stored no reply, before a turn of two answered ones and at the conversation's end."""
    conversation = "c-unanswered"
    data = [
        stored(1, "user", "lost question", "chatcmpl-1", None),
        stored(2, "user", "part one", "chatcmpl-2", None),
        stored(3, "user", "part two", "chatcmpl-2", None),
        stored(4, "assistant", "answer", "chatcmpl-2", "stop"),
        stored(5, "user", "left hanging", "chatcmpl-3", None),
        stored(6, "user", "and more", "chatcmpl-3", None),
    ]
    history = {"object": "list", "data": data, "first_id": data[0]["id"], "last_id": data[-1]["id"],
               "has_more": False}  # fmt: skip
    edge = ScriptedEdge(
        [],
        pages={
            "/": served(PLAYGROUND.read_bytes()),
            f"/v1/conversations/{conversation}/messages?limit=1000": served(
                json.dumps(history).encode(), "application/json"
            ),
        },
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        open_conversation(page, edge.base_url, conversation, "fg-test")

        expect(page.locator("#transcript .msg")).to_have_text(
            ["lost question", "part one", "part two", "answer", "left hanging", "and more"], timeout=WAIT_MS
        )
        failed = ["lost question", "left hanging", "and more"]
        expect(page.locator("#transcript .msg.failed")).to_have_text(failed)
        # One note for each failed turn, after its last question.
        expect(page.locator("#transcript .fail-note")).to_have_text(["no reply stored", "no reply stored"])
        expect(page.locator("#transcript .msg.failed + .fail-note")).to_have_text(["no reply stored"] * 2)
        assert page.evaluate("chat.messages.map(m => m.content)") == ["part one", "part two", "answer"]
        # The last turn's questions, given back to send again, as the page gives back a failed one.
        expect(page.locator("#prompt")).to_have_value("left hanging\n\nand more")
        expect(page.locator("#status-state")).to_have_attribute("data-state", "error")
    finally:
        context.close()
        edge.close()

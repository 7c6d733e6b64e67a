"""A stored turn of several user messages, read back by the playground in a real browser. The edge
stores every user message after the assistant's last as the turn's questions (a question sent in two
parts, two participants of a group chat), each with the reply's request id, then the reply. The page
paired each user message with the message right after it: a turn's first question, followed by the
second rather than by a reply, was shown as failed ("no reply stored") and left out of the context
the next turn sent. A turn's questions are now those of its request id; a question whose request
stored no reply (an edge that died mid-stream) is still a failed turn."""

from __future__ import annotations

import json
import re

import httpx
from playwright.sync_api import Browser, Page, Request, expect

from tests.browser.conftest import SMALL, WAIT_MS, fresh_key
from tests.browser.stored_history import playground_pages, stored
from tests.browser.test_reload_keeps_the_conversation import sent_messages
from tests.client.scripted_edge import ScriptedEdge
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
    edge = ScriptedEdge([], pages=playground_pages(conversation, data))
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


# About 500 tokens on the demo tokenizer, as in test_long_conversation_leaves_out_its_oldest_turns:
# a turn of two such questions and one of 700 fit its 2048-token context; a third question does not.
PART = "word " * 500
LONG = "word " * 700


def test_a_turn_of_two_questions_is_left_out_whole(page: Page, page_server: LiveServer) -> None:
    """Past the model's context the page leaves out the oldest whole turn: it left out a read-back
    turn's first question alone, and sent its second question and reply on without it."""
    key = fresh_key(page_server, "paid", "two-questions-long")
    conversation = "c-two-questions-long"
    first = [{"role": "user", "content": f"part one {PART}"}, {"role": "user", "content": f"part two {PART}"}]
    with httpx.Client(base_url=page_server.base_url, timeout=30.0) as client:
        auth = {"Authorization": f"Bearer {key}"}
        body = {"model": SMALL, "messages": first, "max_tokens": 4, "conversation_id": conversation}
        answer = client.post("/v1/chat/completions", json=body, headers=auth)
        assert answer.status_code == 200, answer.text
        reply = {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
        body["messages"] = [*first, reply, {"role": "user", "content": f"turn 2 {LONG}"}]
        answer = client.post("/v1/chat/completions", json=body, headers=auth)
        assert answer.status_code == 200, answer.text

    open_conversation(page, page_server.base_url, conversation, key)
    expect(page.locator("#transcript .msg")).to_have_count(5, timeout=WAIT_MS)
    page.fill("#model", SMALL)
    page.fill("#max-tokens", "4")
    sent: list[list[dict[str, str]]] = []

    def record(request: Request) -> None:
        if request.url.endswith("/v1/chat/completions") and request.method == "POST":
            sent.append(json.loads(request.post_data or "{}")["messages"])

    page.on("request", record)
    page.fill("#prompt", f"turn 3 {LONG}")
    page.click("#send")
    expect(page.locator("#status-state")).to_have_attribute("data-state", re.compile("done"), timeout=WAIT_MS)

    # Refused whole, then sent from the second turn on: never from the first turn's second question.
    assert [[m["content"].split(" word")[0] for m in messages] for messages in sent[1:]] == [
        ["turn 2", sent[-1][1]["content"], "turn 3"]
    ]
    expect(page.locator("#status-state")).to_contain_text("1 earlier turn left out")
    expect(page.locator("#transcript .msg.left-out")).to_have_count(3)

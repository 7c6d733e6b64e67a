"""A reload in the middle of a chat, in a real browser against a real edge. The edge stores every
turn of a named conversation (the page names one with each send), but the page kept the chat only in
its memory and drew a new conversation id at each load: a reload (F5, a restored tab) showed an empty
page and the next message went out with none of the earlier turns. The tab keeps its conversation's
id now, and reads the turns back from GET /v1/conversations/{id}/messages, in their order."""

from __future__ import annotations

import json

from playwright.sync_api import Page, expect

from tests.browser.conftest import ENDED, WAIT_MS, fresh_key, turn
from tests.support.live_server import LiveServer


def two_turns(page: Page, key: str, remember: bool) -> list[str]:
    page.fill("#api-key", key)
    if remember:
        page.check("#remember-key")
    turn(page, "first question", 8)
    turn(page, "second question", 8)
    shown = page.locator("#transcript .msg").all_text_contents()
    assert len(shown) == 4 and shown[0] == "first question" and shown[2] == "second question", shown
    return shown


def sent_messages(page: Page, prompt: str) -> list[dict[str, str]]:
    """Send `prompt` and give back the messages its request carried."""
    page.fill("#prompt", prompt)
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as request:
        page.click("#send")
    expect(page.locator("#status-state")).to_have_attribute("data-state", ENDED, timeout=WAIT_MS)
    return list(json.loads(request.value.post_data or "{}")["messages"])


def test_a_reload_shows_the_conversation_in_order_and_goes_on_with_it(
    page: Page, page_server: LiveServer
) -> None:
    shown = two_turns(page, fresh_key(page_server, "paid", "reload"), remember=True)

    page.reload()

    expect(page.locator("#transcript .msg")).to_have_text(shown, timeout=WAIT_MS)
    expect(page.locator("#transcript .msg.failed")).to_have_count(0)
    page.fill("#max-tokens", "8")
    sent = sent_messages(page, "third question")
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "first question"),
        ("assistant", shown[1]),
        ("user", "second question"),
        ("assistant", shown[3]),
        ("user", "third question"),
    ]


def test_a_key_not_remembered_brings_the_conversation_back_once_entered(
    page: Page, page_server: LiveServer
) -> None:
    key = fresh_key(page_server, "paid", "reload-unremembered")
    shown = two_turns(page, key, remember=False)

    page.reload()
    expect(page.locator("#api-key")).to_have_value("")
    # The key typed and Send clicked at once: the earlier turns come back first, the message after them.
    page.fill("#api-key", key)
    page.fill("#max-tokens", "8")
    sent = sent_messages(page, "third question")

    assert [m["content"] for m in sent[:4]] == ["first question", shown[1], "second question", shown[3]]
    expect(page.locator("#transcript .msg.user")).to_have_text(
        ["first question", "second question", "third question"]
    )

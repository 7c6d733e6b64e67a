"""A conversation grown past the model's context: every turn resends it whole, so each later send
was refused with context_length_exceeded and the page told its user to press New chat, throwing the
conversation away (a chat product's user expects the oldest turns to drop out of the context, as
chat apps do). The page now leaves out the oldest whole turns until the rest fits, says so, and sends
the later turns from there; the transcript keeps every turn on screen."""

from __future__ import annotations

import json
import re

from playwright.sync_api import Page, Request, expect

from tests.browser.conftest import SMALL, WAIT_MS, turn
from tests.support.live_server import LiveServer

# About 700 tokens on the demo tokenizer: two turns fit its 2048-token context, three do not.
LONG = "word " * 700


def test_a_conversation_past_the_context_leaves_out_its_oldest_turns(
    page: Page, page_server: LiveServer
) -> None:
    sent: list[list[dict[str, str]]] = []

    def record(request: Request) -> None:
        if request.url.endswith("/v1/chat/completions") and request.method == "POST":
            sent.append(json.loads(request.post_data or "{}")["messages"])

    page.on("request", record)
    page.fill("#api-key", page_server.keys["paid"])
    page.fill("#model", SMALL)
    for n in range(1, 3):
        turn(page, f"turn {n} {LONG}", 4)
    page.fill("#prompt", f"turn 3 {LONG}")
    page.click("#send")
    expect(page.locator("#transcript .msg.user")).to_have_count(3, timeout=WAIT_MS)
    state = page.locator("#status-state")
    expect(state).not_to_contain_text("New chat")
    expect(state).to_have_attribute("data-state", re.compile("done"), timeout=WAIT_MS)
    expect(state).to_contain_text("1 earlier turn left out")
    # The third turn went out without the first, whole: its question and its reply, nothing split.
    assert [m["role"] for m in sent[-1]] == ["user", "assistant", "user"], sent[-1]
    assert sent[-1][0]["role"] == "user" and sent[-1][0]["content"].startswith("turn 2")
    # On screen every turn stays, the left-out one marked as such.
    expect(page.locator("#transcript .msg")).to_have_count(6, timeout=WAIT_MS)
    expect(page.locator("#transcript .msg.left-out")).to_have_count(2)
    expect(page.locator("#transcript .msg.user.left-out")).to_contain_text("turn 1")

    # The next turn starts from where the last one did: one request when it fits, not a refusal
    # for every turn left out before.
    before = len(sent)
    turn(page, "short", 4)
    assert len(sent) == before + 1
    assert sent[-1][0]["content"].startswith("turn 2")
    expect(state).not_to_contain_text("left out")

"""New chat pressed while a 429's wait is counted down: the new chat's status said "idle" for a
quarter of a second, then the old countdown wrote over it again ("rate limited (requests): try again
in 57 s") and, at its end, "ready: you can send again", in a chat that had sent nothing (a review).
New chat ends the countdown with the rest of the old chat's status."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.browser.conftest import fresh_key
from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def send(page: Page, key: str, prompt: str) -> None:
    page.fill("#api-key", key)
    page.fill("#max-tokens", "4")
    page.fill("#prompt", prompt)
    page.click("#send")


def test_new_chat_stops_the_last_chats_rate_limit_countdown(page: Page, page_server: LiveServer) -> None:
    state = page.locator("#status-state")
    # A free user gets one request a minute: the second send is refused.
    key = fresh_key(page_server, "free", "countdown")
    send(page, key, "first")
    expect(state).to_have_attribute("data-state", re.compile("done|stopped"), timeout=WAIT_MS)
    send(page, key, "second, too soon")
    expect(state).to_have_attribute("data-state", "limited", timeout=WAIT_MS)
    expect(state).to_contain_text(re.compile(r"try again in \d+ s"))

    page.click("#new-chat")
    expect(state).to_have_text("idle")
    # The countdown's ticks come every 250 ms from its interval timer: none is left to write over
    # the new chat's status (checked on the timer itself, as waiting for a tick that should never
    # come would be a sleep).
    assert page.evaluate("chat.waitTimer") is None

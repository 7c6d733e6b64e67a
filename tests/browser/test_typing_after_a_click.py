"""Typing straight after clicking Send or New chat, as one does in a chat: Send, disabled for the
reply, dropped the focus to the page and New chat kept it, so the next message typed went nowhere
(a review). Both leave the focus in the message box; New chat with no key yet, in the key field."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def test_the_next_message_can_be_typed_after_clicking_send_or_new_chat(
    page: Page, page_server: LiveServer
) -> None:
    page.fill("#api-key", page_server.keys["paid"])
    page.fill("#max-tokens", "4")
    page.fill("#prompt", "hello")
    page.click("#send")
    expect(page.locator("#status-state")).to_have_attribute(
        "data-state", re.compile("done|stopped"), timeout=WAIT_MS
    )
    page.keyboard.type("and then")
    expect(page.locator("#prompt")).to_have_value("and then")

    page.click("#new-chat")
    page.keyboard.type(", afresh")
    expect(page.locator("#prompt")).to_have_value("and then, afresh")


def test_new_chat_with_no_key_yet_leaves_the_focus_in_the_key_field(page: Page) -> None:
    """With the key field empty, New chat put the focus in the message box, whose send could only
    refuse for want of a key: what is typed next is the key."""
    page.click("#new-chat")
    page.keyboard.type("fg-typed-after-new-chat")
    expect(page.locator("#api-key")).to_have_value("fg-typed-after-new-chat")
    expect(page.locator("#prompt")).to_have_value("")

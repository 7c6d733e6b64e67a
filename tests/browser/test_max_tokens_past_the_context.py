"""A Max tokens that, with the conversation, is more than the model's context holds (2040 of a
2048-token model, a short conversation): the edge refuses it with context_length_exceeded. The page
said the conversation had outgrown the model and sent its user to New chat, throwing away a
conversation of a few dozen tokens that a smaller Max tokens carried on (a review). It now names the
Max tokens that fits, and that Max tokens goes through with the conversation kept."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.browser.conftest import SMALL
from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def test_a_max_tokens_past_the_context_says_which_max_tokens_fits(
    page: Page, page_server: LiveServer
) -> None:
    page.fill("#api-key", page_server.keys["paid"])
    page.fill("#model", SMALL)
    page.fill("#max-tokens", "4")
    page.fill("#prompt", "hello")
    page.press("#prompt", "Enter")
    state = page.locator("#status-state")
    expect(state).to_have_attribute("data-state", re.compile("done|stopped"), timeout=WAIT_MS)

    page.fill("#max-tokens", "2040")
    page.fill("#prompt", "and again")
    page.press("#prompt", "Enter")
    expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
    expect(state).not_to_contain_text("outgrown")
    advice = re.search(r"Lower Max tokens to (\d+) or less, or press New chat\.$", state.text_content() or "")
    assert advice, state.text_content()
    expect(page.locator("#prompt")).to_have_value("and again")

    page.fill("#max-tokens", advice.group(1))
    page.press("#prompt", "Enter")
    expect(state).to_have_attribute("data-state", re.compile("done|stopped"), timeout=WAIT_MS)
    expect(page.locator("#transcript .msg.user:not(.failed)")).to_have_text(["hello", "and again"])

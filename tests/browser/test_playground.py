"""The playground page in headless Chromium against a real edge: streaming, Stop, escaping, 429s."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.client.live import LONG_REPLY, LONG_REPLY_TOKENS
from tests.support.live_server import LiveServer

WAIT_MS = 30_000
TOKENS_PER_S = re.compile(r"^\d+(\.\d+)? tok/s$")
REPLY_LENGTH = (
    "() => { const r = document.querySelectorAll('#transcript .msg.assistant'); "
    "return r.length ? r[r.length - 1].textContent.length : 0; }"
)


@pytest.fixture
def page(browser: Browser, page_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    page.goto(page_server.base_url + "/")
    yield page
    context.close()


def send(page: Page, key: str, prompt: str, max_tokens: int, temperature: float | None = None) -> None:
    page.fill("#api-key", key)
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "" if temperature is None else str(temperature))
    page.fill("#prompt", prompt)
    page.click("#send")


def test_a_reply_streams_in_token_by_token_and_stop_ends_it(
    page: Page, page_server: LiveServer, screenshots: Path
) -> None:
    send(page, page_server.keys["paid"], LONG_REPLY.prompt, LONG_REPLY_TOKENS, LONG_REPLY.temperature)

    # The reply grows over several frames, not all at once.
    lengths = [int(page.evaluate(REPLY_LENGTH))]
    for _ in range(3):
        page.wait_for_function(f"n => ({REPLY_LENGTH})() > n", arg=lengths[-1], timeout=WAIT_MS)
        lengths.append(int(page.evaluate(REPLY_LENGTH)))
    assert sum(later > earlier for earlier, later in itertools.pairwise(lengths)) >= 2, lengths
    expect(page.locator("#status-state")).to_have_attribute("data-state", "streaming")
    expect(page.locator("#ttft")).to_have_text(re.compile(r"^TTFT \d+ ms$"))
    expect(page.locator("#limits")).to_contain_text("requests")
    expect(page.locator("#tps")).to_have_text(TOKENS_PER_S)

    page.click("#stop")
    expect(page.locator("#status-state")).to_have_attribute("data-state", "stopped", timeout=WAIT_MS)
    expect(page.locator("#status-state")).to_have_text("stopped")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    stopped_at = int(page.evaluate(REPLY_LENGTH))
    assert 0 < stopped_at
    expect(page.locator("#tps")).to_have_text(TOKENS_PER_S)
    # Model output went in as text: the transcript bubbles hold no elements at all.
    assert page.evaluate("document.querySelectorAll('#transcript .msg *').length") == 0
    page.screenshot(path=str(screenshots / "playground.png"))


def test_the_conversation_is_sent_as_context_and_html_stays_text(page: Page, page_server: LiveServer) -> None:
    markup = '<img src=x onerror="window.injected=1"><b>bold?</b>'
    send(page, page_server.keys["paid"], markup, 8)
    expect(page.locator("#status-state")).to_have_attribute(
        "data-state", re.compile("done|stopped"), timeout=WAIT_MS
    )
    send(page, page_server.keys["paid"], "And a second turn", 8)
    expect(page.locator("#status-state")).to_have_attribute(
        "data-state", re.compile("done|stopped"), timeout=WAIT_MS
    )

    user_messages = page.locator("#transcript .msg.user")
    expect(user_messages).to_have_count(2)
    expect(user_messages.first).to_have_text(markup)
    assert page.evaluate("document.querySelectorAll('#transcript .msg *').length") == 0
    assert page.evaluate("window.injected") is None
    # Two user turns and the first reply went out with the second request.
    assert page.evaluate("chat.messages.map(m => m.role).join(',')") == "user,assistant,user,assistant"


def test_a_rate_limited_send_shows_the_wait_and_gives_the_prompt_back(
    page: Page, page_server: LiveServer, screenshots: Path
) -> None:
    send(page, page_server.keys["free"], "first", 4)
    expect(page.locator("#status-state")).to_have_attribute(
        "data-state", re.compile("done|stopped"), timeout=WAIT_MS
    )
    send(page, page_server.keys["free"], "second, too soon", 4)
    state = page.locator("#status-state")
    expect(state).to_have_attribute("data-state", "limited", timeout=WAIT_MS)
    expect(state).to_contain_text(re.compile(r"rate limited \(requests\): try again in \d+"))
    expect(page.locator("#prompt")).to_have_value("second, too soon")
    page.screenshot(path=str(screenshots / "playground-429.png"))


def test_the_page_fits_a_narrow_screen(browser: Browser, page_server: LiveServer, screenshots: Path) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True)
    page = context.new_page()
    page.goto(page_server.base_url + "/")
    send(page, page_server.keys["paid"], "Hello on a phone", 24)
    expect(page.locator("#status-state")).to_have_attribute(
        "data-state", re.compile("done|stopped"), timeout=WAIT_MS
    )
    # Nothing spills sideways: the document is no wider than the screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    page.screenshot(path=str(screenshots / "playground-narrow.png"))
    context.close()

"""What a screen reader says of a turn, read off the page's live regions (what assistive technology
announces) in a real browser.

The status line was the page's one live region, polite: the reply itself was never announced (a
screen-reader user heard "queued", "streaming", "done" and had to go looking for it), an error was
announced as politely as "streaming", and a rate limit's countdown was announced afresh at each
tick. The reply is announced once, whole, as it ends (never token by token: it is busy meanwhile),
and errors and refusals assertively, once."""

from __future__ import annotations

import re

from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import WAIT_MS, PacedReplica, fresh_key, turn
from tests.support.live_server import LiveServer

# Every change under a live region, as {politeness, text of the region after it}: what assistive
# technology is told to speak.
RECORD_ANNOUNCEMENTS = """() => {
  window.announced = [];
  const LIVE = '[aria-live]:not([aria-live="off"]), [role="status"], [role="alert"], [role="log"]';
  const politeness = (region) => region.getAttribute("aria-live") ||
    (region.getAttribute("role") === "alert" ? "assertive" : "polite");
  new MutationObserver((mutations) => {
    for (const mutation of mutations) {
      const target = mutation.target.nodeType === 1 ? mutation.target : mutation.target.parentElement;
      const region = target && target.closest(LIVE);
      if (region) window.announced.push({ politeness: politeness(region), text: region.textContent });
    }
  }).observe(document.body, { childList: true, characterData: true, subtree: true });
}"""


def announced(page: Page, politeness: str) -> list[str]:
    said = "(politeness) => window.announced.filter(a => a.politeness === politeness).map(a => a.text)"
    return list(page.evaluate(said, politeness))


def test_the_reply_is_announced_once_as_it_ends_not_token_by_token(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.base_url + "/")
        page.evaluate(RECORD_ANNOUNCEMENTS)
        page.fill("#api-key", server.keys["paid"])
        page.fill("#max-tokens", "150")
        page.fill("#prompt", "tell me a story")
        page.click("#send")
        reply = page.locator("#transcript .msg.assistant")
        expect(reply).to_have_text(re.compile(".{10}"), timeout=WAIT_MS)
        expect(reply).to_have_attribute("aria-busy", "true")
        expect(page.locator("#status-state")).to_have_attribute("data-state", "done", timeout=WAIT_MS)
        expect(reply).not_to_have_attribute("aria-busy", "true")

        text = reply.inner_text()
        polite = announced(page, "polite")
        # queued, streaming, then the reply: a handful, whatever the number of tokens.
        assert len(polite) <= 4, polite
        assert text in polite[-1] and "done" in polite[-1], polite
        assert announced(page, "assertive") == []
    finally:
        context.close()


def test_an_error_is_announced_assertively(page: Page) -> None:
    page.evaluate(RECORD_ANNOUNCEMENTS)
    page.fill("#api-key", "fg-not-a-key")
    page.fill("#prompt", "hello")
    page.click("#send")
    expect(page.locator("#status-state")).to_have_attribute("data-state", "error", timeout=WAIT_MS)
    assertive = announced(page, "assertive")
    assert len(assertive) == 1 and "HTTP 401" in assertive[0], assertive

    # The same error again is announced again: the region's text alone would not change.
    page.fill("#prompt", "hello again")
    page.click("#send")
    expect(page.locator("#transcript .msg.user")).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator("#status-state")).to_have_attribute("data-state", "error", timeout=WAIT_MS)
    assert len(announced(page, "assertive")) == 2


def test_a_rate_limits_countdown_is_announced_once_not_at_each_tick(
    page: Page, page_server: LiveServer
) -> None:
    page.fill("#api-key", fresh_key(page_server, "free", "countdown"))
    turn(page, "hello", 2)
    page.evaluate(RECORD_ANNOUNCEMENTS)
    page.fill("#prompt", "again")
    page.click("#send")
    state = page.locator("#status-state")
    expect(state).to_have_attribute("data-state", "limited", timeout=WAIT_MS)
    first = state.inner_text()
    # Two ticks of the visible countdown (whole seconds at this wait).
    expect(state).not_to_have_text(first, timeout=WAIT_MS)
    second = state.inner_text()
    expect(state).not_to_have_text(second, timeout=WAIT_MS)
    assertive = announced(page, "assertive")
    assert len(assertive) == 1 and "rate limited" in assertive[0], assertive
    assert [text for text in announced(page, "polite") if "try again" in text] == []

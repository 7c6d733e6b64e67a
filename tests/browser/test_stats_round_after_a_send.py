"""The stats round a send starts once its reply ends. With a round under way then (the timer's, every
2 s), the send's round was skipped: the line kept that round's figures, asked before the turn
ended, and the turn's own cache hits and blocks waited for the timer's next round. A send now starts
its round at once, superseding the one under way, as a changed key or model does."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.conftest import SMALL, fresh_key
from tests.support.live_server import LiveServer

WAIT_MS = 30_000
# Every round counted as it begins; with `hold` set, each then waits (under way) until released.
HOLD_ROUNDS = """() => {
  window.roundsBegun = 0;
  window.hold = false;
  window.held = [];
  const pageLoadStats = loadStats;
  loadStats = async () => {
    window.roundsBegun += 1;
    if (window.hold) await new Promise((release) => window.held.push(release));
    return pageLoadStats();
  };
}"""


def test_a_send_starts_its_stats_round_while_another_is_under_way(
    page: Page, page_server: LiveServer
) -> None:
    page.evaluate(HOLD_ROUNDS)
    page.fill("#api-key", fresh_key(page_server, "paid", "stats-after-send"))
    page.press("#api-key", "Tab")
    page.fill("#model", SMALL)
    page.press("#model", "Tab")
    expect(page.locator("#replicas .replica").first).to_be_visible(timeout=WAIT_MS)
    page.evaluate("() => { window.hold = true; }")
    page.wait_for_function("() => window.held.length === 1", timeout=WAIT_MS)  # a timer round, under way
    begun = page.evaluate("() => window.roundsBegun")
    page.fill("#max-tokens", "4")
    page.fill("#prompt", "hello")
    page.click("#send")
    expect(page.locator("#status-state")).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    # The send's round began as the reply ended (before its state was shown), not after the held one.
    assert page.evaluate("() => window.roundsBegun") == begun + 1

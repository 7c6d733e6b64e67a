"""The key a stats round asks with. A round on the page's timer read the key field as it stood: with
someone typing a key, it sent the half-typed text to the edge (one more 401 in its log and metrics)
and blanked the stats line of the key entered before (a review). Rounds now ask with the key as last
entered (the field changed, left, or Enter pressed in it)."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.conftest import NUMBER_ROUNDS
from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def test_a_round_on_the_timer_asks_with_the_entered_key_not_the_half_typed_one(
    page: Page, page_server: LiveServer
) -> None:
    page.evaluate(NUMBER_ROUNDS)
    page.fill("#api-key", page_server.keys["paid"])
    page.press("#api-key", "Tab")
    replicas = page.locator("#replicas .replica")
    expect(replicas.first).to_be_visible(timeout=WAIT_MS)
    page.fill("#api-key", "fg-half-ty")  # still in the field: typed, not entered
    refused = page_server.rejected(401)
    begun = page.evaluate("() => window.roundsBegun")
    # A round the timer began after the typing, ended.
    page.wait_for_function("(begun) => window.lastRoundEnded > begun", arg=begun, timeout=WAIT_MS)
    assert page_server.rejected(401) == refused
    assert replicas.count() > 0

"""The model a stats round asks for, and what a refused model shows. A round on the page's timer read
the model field as it stood: with someone typing a model's name, it asked for the half-typed name
(a 404 model_not_found in the edge's log and metrics) and blanked the stats line. Rounds now ask for
the model as last entered (the field changed: left, or Enter pressed in it), as they do with the key;
an entered model the edge refuses says so on the line, where it was left blank."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.conftest import NUMBER_ROUNDS, SMALL
from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def show_stats(page: Page, key: str) -> None:
    page.fill("#api-key", key)
    page.press("#api-key", "Tab")
    expect(page.locator("#replicas .replica").first).to_be_visible(timeout=WAIT_MS)


def test_a_round_on_the_timer_asks_for_the_entered_model_not_the_half_typed_one(
    page: Page, page_server: LiveServer
) -> None:
    page.evaluate(NUMBER_ROUNDS)
    show_stats(page, page_server.keys["paid"])
    page.fill("#model", SMALL[:-2])  # still in the field: typed, not entered
    refused = page_server.rejected(404)
    begun = page.evaluate("() => window.roundsBegun")
    # A round the timer began after the typing, ended.
    page.wait_for_function("(begun) => window.lastRoundEnded > begun", arg=begun, timeout=WAIT_MS)
    assert page_server.rejected(404) == refused
    assert page.locator("#replicas .replica").count() > 0


def test_an_entered_model_the_key_may_not_use_is_said_on_the_stats_line(
    page: Page, page_server: LiveServer
) -> None:
    show_stats(page, page_server.keys["paid"])
    page.fill("#model", "floodgate-nope")
    page.press("#model", "Enter")
    refusal = page.locator("#replicas .refused")
    expect(refusal).to_contain_text("HTTP 404", timeout=WAIT_MS)
    expect(refusal).to_contain_text("floodgate-nope")
    assert page.locator("#replicas .replica").count() == 0

"""A stats round under way when the key or the model field changes. The page waited for it to end:
the old pair's figures (or refusal) were shown for the new pair, whose own round came only with the
timer, about 2 s later; and a late answer of the old pair's overwrote whatever was shown (a review).
A change now starts its round at once, and an answer of a round that a newer one superseded is
dropped. The old pair's round is held in the page: its stats request reaches the edge, and its
answer is handed to the page only when the test says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import LARGE, SMALL
from tests.support.live_server import LiveServer

WAIT_MS = 30_000
# The answers to the stats of LARGE (the paid key's default) wait in window.held until released.
HOLD_LARGE_STATS = f"""
window.held = [];
const pageFetch = window.fetch;
window.fetch = (url, init) => {{
  const answer = pageFetch(url, init);
  if (!String(url).endsWith("/v1/models/{LARGE}/stats")) return answer;
  return answer.then((response) => new Promise((release) => window.held.push(() => release(response))));
}};
"""
# The stats rounds not ended yet, the page's own timer's among them.
COUNT_OPEN_ROUNDS = """() => {
  window.roundsOpen = 0;
  const pageLoadStats = loadStats;
  loadStats = async () => {
    window.roundsOpen += 1;
    try { await pageLoadStats(); } finally { window.roundsOpen -= 1; }
  };
}"""
NOT_A_KEY = "fg-not-a-real-key"
NOT_A_MODEL = "no-such-model"


@pytest.fixture
def held_page(browser: Browser, page_server: LiveServer) -> Iterator[Page]:
    """The paid key entered, its round's stats (LARGE's) asked of the edge and their answer held."""
    context = browser.new_context()
    context.add_init_script(HOLD_LARGE_STATS)
    page = context.new_page()
    page.goto(page_server.base_url + "/")
    page.evaluate(COUNT_OPEN_ROUNDS)
    page.fill("#api-key", page_server.keys["paid"])
    page.press("#api-key", "Tab")
    page.wait_for_function("() => window.held.length === 1", timeout=WAIT_MS)
    yield page
    context.close()


def enter(page: Page, field: str, value: str) -> None:
    page.fill(field, value)
    page.press(field, "Tab")


@pytest.mark.parametrize("field", ["#api-key", "#model"])
def test_a_change_shows_its_own_stats_while_the_old_round_is_under_way(
    held_page: Page, page_server: LiveServer, field: str
) -> None:
    # Another key (free2: its default, SMALL), or another model for the same key.
    enter(held_page, field, page_server.keys["free2"] if field == "#api-key" else SMALL)
    expect(held_page.locator("#replicas .replica").first).to_be_visible(timeout=WAIT_MS)
    assert held_page.evaluate("() => window.held.length") == 1  # the old round is still under way


@pytest.mark.parametrize("field", ["#api-key", "#model"])
def test_the_old_rounds_late_answer_does_not_overwrite_the_new_one(
    held_page: Page, page_server: LiveServer, field: str
) -> None:
    # The new pair is refused (a wrong key, a model no tier has): its stats line is empty, where the
    # old pair's answer would show LARGE's replicas.
    value = NOT_A_KEY if field == "#api-key" else NOT_A_MODEL
    asked = f"{NOT_A_KEY}\n" if field == "#api-key" else f"{page_server.keys['paid']}\n{NOT_A_MODEL}"
    enter(held_page, field, value)
    held_page.wait_for_function("(asked) => stats.refused === asked", arg=asked, timeout=WAIT_MS)
    held_page.evaluate("() => window.held.forEach((release) => release())")
    held_page.wait_for_function("() => window.roundsOpen === 0", timeout=WAIT_MS)
    assert held_page.locator("#replicas .replica").count() == 0

"""The stats line's rounds (every 2 s while the page is shown) after the edge refused the key or the
model field: a wrong or revoked key, a model the key may not use. Waiting changes neither, yet each
round asked again: one more refusal in the edge's log and metrics, and one more error in the page's
console, every 2 s for as long as the tab stayed open (a review). A refused pair is now asked again
only once the key or the model field changes, the key is entered again, or a send is answered."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.conftest import LARGE
from tests.edge.sse_client import wait_until
from tests.support.live_server import LiveServer

WAIT_MS = 30_000
# Rounds run straight from the page's code, one after another, past the timer's 2 s wait.
THREE_ROUNDS = "async () => { for (let i = 0; i < 3; i++) await loadStats(); }"
SET_QUIETLY = """([id, value]) => {
  document.getElementById(id).value = value;
  if (id === "api-key") stats.key = value;
  if (id === "model") stats.model = value;
}"""


def set_quietly(page: Page, field: str, value: str) -> None:
    """The field's value with no change event: the rounds on the page's timer are then the only
    requests the stats line makes (a change starts a round and a model listing of its own). The
    value is also made the entered one, which the rounds ask with."""
    page.evaluate(SET_QUIETLY, [field, value])


def refused_again(page: Page, server: LiveServer, status: int) -> float:
    """Wait for a round's refusal, then run three rounds more: the refusals they added."""
    before = server.rejected(status)
    wait_until(lambda: server.rejected(status) > before, what=f"a stats round refused {status}")
    page.wait_for_function("() => !stats.busy", timeout=WAIT_MS)  # that round has ended
    after = server.rejected(status)
    page.evaluate(THREE_ROUNDS)
    return server.rejected(status) - after


def test_a_refused_key_is_not_asked_again_until_it_changes(page: Page, page_server: LiveServer) -> None:
    set_quietly(page, "api-key", "fg-not-a-real-key")
    assert refused_again(page, page_server, 401) == 0
    # Another key: asked at once, and its replicas shown.
    page.fill("#api-key", page_server.keys["paid"])
    page.press("#api-key", "Tab")
    expect(page.locator("#replicas .replica").first).to_be_visible(timeout=WAIT_MS)


def test_a_model_the_key_may_not_use_is_not_asked_again_until_it_changes(
    page: Page, page_server: LiveServer
) -> None:
    set_quietly(page, "api-key", page_server.keys["free2"])
    set_quietly(page, "model", LARGE)  # the paid tier's: 404 model_not_found for a free key
    assert refused_again(page, page_server, 404) == 0
    page.fill("#model", "")
    page.press("#model", "Tab")
    expect(page.locator("#replicas .replica").first).to_be_visible(timeout=WAIT_MS)


def test_a_refused_key_entered_again_is_asked_again_at_once(page: Page, page_server: LiveServer) -> None:
    """The same text typed in again (a key the edge did not know yet, or one re-enabled): the field
    fires no change event for it, and the refusal it remembered left the stats line blank until a
    send or a reload."""
    key = "fg-not-known-yet"
    set_quietly(page, "api-key", key)
    assert refused_again(page, page_server, 401) == 0
    before = page_server.rejected(401)
    page.fill("#api-key", "")
    page.fill("#api-key", key)
    page.press("#api-key", "Tab")
    wait_until(lambda: page_server.rejected(401) > before, what="the key entered again to be asked again")

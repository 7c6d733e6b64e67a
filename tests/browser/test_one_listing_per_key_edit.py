"""One edit of the key field, one GET /v1/models at the edge. Leaving the field (or pressing Enter)
fires its change, which lists the key's models for the model field, and starts a stats round, which
lists them too while the first listing is under way: two requests for one edit (a review), each a
refusal in the edge's log and metrics for a wrong key. A second ask for the same key now shares the
listing under way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tests.edge.sse_client import wait_until
from tests.support.live_server import LiveServer

WAIT_MS = 30_000
# Observes the page's requests (it passes each one through): the test waits for them all to be
# answered before it reads the edge's count, so that a late second request is not missed.
COUNT_FETCHES = """
window.fetchesOpen = 0;
const pageFetch = window.fetch;
window.fetch = (...args) => {
  window.fetchesOpen += 1;
  return pageFetch(...args).finally(() => { window.fetchesOpen -= 1; });
};
"""


@pytest.fixture
def counted_page(browser: Browser, page_server: LiveServer) -> Iterator[Page]:
    context = browser.new_context()
    context.add_init_script(COUNT_FETCHES)
    page = context.new_page()
    page.goto(page_server.base_url + "/")
    # No round on the page's timer in between: the edit's requests are the only ones.
    page.evaluate("() => clearTimeout(stats.timer)")
    yield page
    context.close()


@pytest.mark.parametrize("leave", ["Tab", "Enter"])
def test_one_edit_of_the_key_is_one_request(counted_page: Page, page_server: LiveServer, leave: str) -> None:
    before = page_server.rejected(401)
    counted_page.fill("#api-key", "fg-not-a-real-key")
    counted_page.press("#api-key", leave)
    wait_until(lambda: page_server.rejected(401) > before, what="the key's listing to be refused")
    counted_page.wait_for_function("() => window.fetchesOpen === 0 && !stats.busy", timeout=WAIT_MS)
    assert page_server.rejected(401) - before == 1

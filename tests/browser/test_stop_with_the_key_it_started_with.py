"""Stop's cancel carries the key the stream was started with. It carried the key field as it stood:
a key edited (or emptied) mid-reply sent the cancel with another user's key or none, which the edge
refused (401, or 404 for a request of another user), and the page fell back to dropping the stream."""

from __future__ import annotations

from playwright.sync_api import Browser, expect

from tests.browser.conftest import PacedReplica
from tests.client.live import LONG_REPLY_TOKENS
from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def test_stop_after_the_key_field_was_edited_cancels_with_the_streams_key(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.base_url + "/")
        page.fill("#api-key", server.keys["paid"])
        page.fill("#max-tokens", str(LONG_REPLY_TOKENS))
        page.fill("#prompt", "Tell me a long story.")
        page.click("#send")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "streaming", timeout=WAIT_MS)
        page.fill("#api-key", server.keys["free"])  # another user's key, typed in mid-reply
        with page.expect_response(lambda r: r.url.endswith("/cancel")) as cancel:
            page.click("#stop")
        assert cancel.value.status == 200
        expect(state).to_have_attribute("data-state", "stopped", timeout=WAIT_MS)
    finally:
        context.close()

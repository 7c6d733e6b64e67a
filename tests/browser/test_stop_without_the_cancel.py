"""Stop whose cancel does not get through (refused, failed, or stuck behind the browser's six
connections to the edge), in a real browser against a real edge whose replica writes slowly. The
page then drops the stream, which the edge stores as `disconnected`, as it does a network's loss:
the page showed the reply stopped and kept it, and after a reload read it back as failed, out of
the conversation. The tab remembers which streams its Stop dropped; a drop it did not ask for (a
reload mid-reply here) still reads as failed."""

from __future__ import annotations

import re
import time

import httpx
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import WAIT_MS, PacedReplica
from tests.support.live_server import LiveServer


def start_a_long_reply(page: Page, server: LiveServer) -> None:
    page.goto(server.base_url + "/")
    page.fill("#api-key", server.keys["paid"])
    page.check("#remember-key")
    page.fill("#max-tokens", "2000")
    page.fill("#prompt", "tell me a long story")
    page.click("#send")
    expect(page.locator("#transcript .msg.assistant")).to_have_text(re.compile(".{20}"), timeout=WAIT_MS)


def wait_for_the_stored_reply(page: Page, server: LiveServer) -> None:
    """Until the edge has stored the reply: a dropped stream's turn is stored as the edge closes the
    request, which may come after the page has shown the turn ended."""
    conversation = page.evaluate("chat.conversationId")
    url = f"{server.base_url}/v1/conversations/{conversation}/messages"
    headers = {"Authorization": f"Bearer {server.keys['paid']}"}
    with httpx.Client(timeout=10.0) as client:
        deadline = time.monotonic() + WAIT_MS / 1000
        while time.monotonic() < deadline:
            stored = client.get(url, headers=headers)
            roles = [m["role"] for m in stored.json()["data"]] if stored.status_code == 200 else []
            if roles == ["user", "assistant"]:
                return
            time.sleep(0.02)  # a poll's pace, not a guess at when it is stored
    raise AssertionError("the reply was never stored")


def test_a_reply_stopped_by_dropping_its_stream_reads_stopped_after_a_reload(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        # The cancel fails in the browser: the page falls back to dropping the stream.
        page.route("**/cancel", lambda route: route.abort())
        start_a_long_reply(page, server)
        page.click("#stop")
        expect(page.locator("#status-state")).to_have_text("stopped", timeout=WAIT_MS)
        expect(page.locator("#transcript .cut-note")).to_have_text(["stopped"])
        wait_for_the_stored_reply(page, server)

        page.reload()

        expect(page.locator("#transcript .msg.user")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#transcript .msg.failed")).to_have_count(0)
        expect(page.locator("#transcript .cut-note")).to_have_text(["stopped"])
        reply = page.locator("#transcript .msg.assistant").inner_text()
        assert page.evaluate("chat.messages.map(m => m.role)") == ["user", "assistant"]
        assert page.evaluate("chat.messages[1].content") == reply
    finally:
        context.close()


def test_a_reply_cut_by_a_reload_still_reads_failed(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, _ = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        start_a_long_reply(page, server)

        page.reload()  # nobody pressed Stop: the edge sees the stream dropped
        wait_for_the_stored_reply(page, server)
        page.reload()

        expect(page.locator("#transcript .msg.user.failed")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#transcript .msg.assistant.failed")).to_have_count(1)
        expect(page.locator("#transcript .cut-note")).to_have_count(0)
        assert page.evaluate("chat.messages") == []
    finally:
        context.close()

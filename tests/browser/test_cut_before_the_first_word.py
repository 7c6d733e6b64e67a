"""The stream broken after the edge opened it but before the reply's first word (a proxy closing the
connection while the request waits in the queue): the page said "the connection was lost mid-reply",
of a reply that never began (a review). It now says the request failed before any reply, and gives
the prompt back as for any failed send."""

from __future__ import annotations

from urllib.parse import urlsplit

from playwright.sync_api import Browser, expect

from edge.routes.playground import PLAYGROUND
from edge.sse import ChunkEncoder
from tests.browser.conftest import SMALL, send_from_the_page
from tests.client.scripted_edge import ScriptedEdge, served
from tests.support.flaky_proxy import flaky_proxy
from tests.support.live_server import LiveServer

WAIT_MS = 30_000


def test_a_stream_cut_before_the_first_word_says_no_reply_came(
    browser: Browser, page_server: LiveServer
) -> None:
    port = urlsplit(page_server.base_url).port
    assert port is not None
    # Every connection is cut at the end of the stream's first event, which carries no text.
    with flaky_proxy(port, ["cut_after_start"] * 50) as proxy:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(proxy.base_url + "/")
            page.fill("#api-key", page_server.keys["paid"])
            page.fill("#model", SMALL)
            page.fill("#max-tokens", "16")
            page.fill("#prompt", "hello through a flaky proxy")
            page.click("#send")
            state = page.locator("#status-state")
            expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
            expect(state).to_have_text("the request failed before any reply: the connection was lost")
            expect(page.locator("#prompt")).to_have_value("hello through a flaky proxy")
            expect(page.locator("#transcript .msg.assistant")).to_have_count(0)
        finally:
            context.close()


def test_a_stream_ended_before_the_first_word_says_no_reply_came(browser: Browser) -> None:
    """Opened, then ended cleanly with neither text, finish nor [DONE] (a proxy's idle timeout)."""
    opened = ChunkEncoder("chatcmpl-ended", SMALL, 0).first() + b": keep-alive\n\n"
    edge = ScriptedEdge([opened], pages={"/": served(PLAYGROUND.read_bytes())})
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "hello?")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(state).to_have_text("the request failed before any reply: the connection closed")
        expect(page.locator("#prompt")).to_have_value("hello?")
    finally:
        context.close()
        edge.close()

"""A stream chunk the page cannot read, in a real browser against a scripted edge.

A chunk that is not JSON (a proxy's page spliced in, a truncated write), or JSON of another shape,
threw in the page's stream reading: the page said "the connection was lost mid-reply" and left the
request running, its body still streaming in (the GPU work with it) with no abort or cancel sent."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from edge.routes.playground import PLAYGROUND
from edge.sse import ChunkEncoder
from tests.browser.conftest import SMALL, send_from_the_page
from tests.client.scripted_edge import ScriptedEdge, served

WAIT_MS = 30_000
ENCODER = ChunkEncoder("chatcmpl-odd", SMALL, 0)


@pytest.mark.parametrize("chunk", [b"data: {not json\n\n", b"data: null\n\n", b'data: {"choices": 7}\n\n'])
def test_a_chunk_the_page_cannot_read_ends_the_request_and_says_so(browser: Browser, chunk: bytes) -> None:
    edge = ScriptedEdge(
        [ENCODER.first() + ENCODER.delta("hello") + chunk],
        pages={"/": served(PLAYGROUND.read_bytes())},
        watch_hangup=True,
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "say hello")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(state).to_contain_text("could not read the edge's reply")
        expect(page.locator("#send")).to_be_enabled()
        # The stream is dropped: the edge sees the hang-up, which stops the generation.
        assert edge.hung_up.wait(timeout=WAIT_MS / 1000), "the page left the request running"
    finally:
        context.close()
        edge.close()

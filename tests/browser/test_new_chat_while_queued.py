"""New chat pressed while a message waits in the edge's queue, before its first word: the message is
left behind with its conversation. The page gave it back to the new chat's box once the stop
landed, where its user had asked for a clean start (a review). The new chat's box stays empty."""

from __future__ import annotations

import threading

from playwright.sync_api import Browser, expect

from edge.routes.playground import PLAYGROUND
from edge.sse import ChunkEncoder
from tests.browser.conftest import send_from_the_page
from tests.client.scripted_edge import ScriptedEdge, served

WAIT_MS = 30_000
CANCELLED = b'{"id":"chatcmpl-queued","object":"chat.completion.cancel","status":"CANCELLED"}'
CANCEL_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(CANCELLED)}\r\nconnection: close\r\n\r\n".encode()
    + CANCELLED
)


def test_new_chat_while_queued_leaves_the_new_chats_box_empty(browser: Browser) -> None:
    queued = ChunkEncoder("chatcmpl-queued", "floodgate-tiny", 0).first() + b": keep-alive\n\n"
    release = threading.Event()
    edge = ScriptedEdge(
        [queued], cancel_answer=CANCEL_ANSWER, hold_open=release, pages={"/": served(PLAYGROUND.read_bytes())}
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "an old question")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "queued", timeout=WAIT_MS)
        page.click("#new-chat")
        # The old turn has ended (stopped: the cancel was answered and the stream dropped).
        expect(page.locator("#send")).to_be_enabled(timeout=WAIT_MS)
        expect(state).to_have_attribute("data-state", "stopped")
        expect(page.locator("#prompt")).to_have_value("")
        expect(page.locator("#transcript .msg")).to_have_count(0)
    finally:
        release.set()
        context.close()
        edge.close()

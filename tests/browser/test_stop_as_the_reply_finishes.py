"""Stop pressed as the reply finishes on the server, in a real browser against a scripted edge.

The edge marks a request finished (a cancel then answers 409 request_finished) before it writes the
reply's closing events: its last text, the final chunk, usage, [DONE] (edge/generation.py: close()
then end()). The Python client reads those on after a 409 ("the rest of the reply is on its way").
The page aborted the stream at once on any answer but 200: the tail still in flight was dropped,
the reply shown and kept in the conversation cut short and the turn said "stopped", not "done" (a
review). A 409 now reads the rest under the same grace."""

from __future__ import annotations

import re
import threading

from playwright.sync_api import Browser, expect

from edge.routes.playground import PLAYGROUND
from edge.sse import DONE, ChunkEncoder
from tests.browser.conftest import SMALL, send_from_the_page
from tests.client.scripted_edge import ScriptedEdge, served

WAIT_MS = 30_000
TAIL_DELAY_S = 0.3
CONFLICT_BODY = (
    b'{"error":{"message":"Request chatcmpl-tail has already finished.","type":"invalid_request_error",'
    b'"param":"request_id","code":"request_finished"}}'
)
CONFLICT = (
    b"HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\nx-should-retry: false\r\n"
    + f"content-length: {len(CONFLICT_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + CONFLICT_BODY
)


ENCODER = ChunkEncoder("chatcmpl-tail", SMALL, 0)


def _finishing_edge() -> ScriptedEdge:
    """A stream that sends "hello" and, once a cancel came (answered 409: finished), its tail."""
    return ScriptedEdge(
        [ENCODER.first() + ENCODER.delta("hello")],
        cancel_answer=CONFLICT,
        pages={"/": served(PLAYGROUND.read_bytes())},
        tail_after_cancel=ENCODER.delta(" world") + ENCODER.final("stop", None) + ENCODER.usage(3, 2) + DONE,
        tail_delay_s=TAIL_DELAY_S,
    )


def test_stop_answered_409_keeps_the_rest_of_the_finished_reply(browser: Browser) -> None:
    edge = _finishing_edge()
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "say hello world")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "streaming", timeout=WAIT_MS)
        page.click("#stop")
        expect(state).to_have_attribute("data-state", "done", timeout=WAIT_MS)
        expect(page.locator("#transcript .msg.assistant")).to_have_text("hello world", timeout=WAIT_MS)
        assert page.evaluate("chat.messages[chat.messages.length - 1].content") == "hello world"
    finally:
        context.close()
        edge.close()


def test_stop_whose_cancel_is_still_out_as_the_reply_ends_says_done(browser: Browser) -> None:
    """Stop pressed as the reply ends: its last text, finish_reason "stop" (no cancelled marker)
    and [DONE] arrive while the cancel is still on its way. The reply ended by itself, whole: the
    page called it "stopped" (and took a reply that ended empty out of the conversation, giving
    the prompt back) because Stop had been pressed, whatever the stream said."""
    release = threading.Event()
    edge = ScriptedEdge(
        [ENCODER.first() + ENCODER.delta("hello")],
        pages={"/": served(PLAYGROUND.read_bytes())},
        tail_after_cancel=ENCODER.delta(" world") + ENCODER.final("stop", None) + ENCODER.usage(3, 2) + DONE,
        hold_cancel=release,
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "say hello world")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "streaming", timeout=WAIT_MS)
        page.click("#stop")
        expect(state).not_to_have_attribute("data-state", re.compile("streaming|stopping"), timeout=WAIT_MS)
        assert edge.cancels == 1 and not edge.cancel_answered.is_set()  # the premise: still out
        expect(state).to_have_text("done")
        expect(page.locator("#transcript .msg.assistant")).to_have_text("hello world")
        assert page.evaluate("chat.messages.map(m => m.role + ':' + m.content)") == [
            "user:say hello world",
            "assistant:hello world",
        ]
        expect(page.locator("#send")).to_be_enabled()
    finally:
        release.set()
        context.close()
        edge.close()

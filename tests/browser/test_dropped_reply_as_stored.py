"""A reply that Stop ended by dropping its stream (its cancel refused, failed or late), in a real
browser against a scripted edge (what reaches the browser before the drop cannot be chosen on a
real one). The edge stores the text it had written when it saw the drop, a few tokens more than the
browser had read: the page kept, and sent on as the next turn's context, the shorter text, and a
reload then showed and sent the longer one, which the model's next reply had never seen. The page
now reads the stored reply after such a drop and goes on with it, shown and sent alike."""

from __future__ import annotations

import threading

from playwright.sync_api import Browser, expect

from edge.sse import DONE, ChunkEncoder
from tests.browser.conftest import SMALL, WAIT_MS
from tests.browser.stored_history import playground_pages, stored
from tests.browser.test_reload_keeps_the_conversation import sent_messages
from tests.client.scripted_edge import ScriptedEdge

CONVERSATION = "c-dropped"
REFUSED = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"


def test_the_next_turn_goes_on_with_the_reply_as_stored(browser: Browser) -> None:
    cut = ChunkEncoder("chatcmpl-dropped", SMALL, 0)
    whole = ChunkEncoder("chatcmpl-next", SMALL, 0)
    stored_turn = [
        stored(1, "user", "tell me a story", "chatcmpl-dropped", None),
        stored(2, "assistant", "Once upon a time", "chatcmpl-dropped", "disconnected"),
    ]
    silent = threading.Event()
    edge = ScriptedEdge(
        [
            cut.first() + cut.delta("Once upon a"),
            whole.first() + whole.delta("Fine.") + whole.final("stop", None) + DONE,
        ],
        cancel_answer=REFUSED,  # the cancel fails: Stop drops the stream
        hold_open=silent,
        pages=playground_pages(CONVERSATION, stored_turn),
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(edge.base_url + "/")
        page.evaluate(f"chat.conversationId = {CONVERSATION!r}")
        page.fill("#api-key", "fg-test")
        page.fill("#model", SMALL)
        page.fill("#prompt", "tell me a story")
        page.click("#send")
        expect(page.locator("#transcript .msg.assistant")).to_have_text("Once upon a", timeout=WAIT_MS)
        page.click("#stop")
        expect(page.locator("#status-state")).to_have_text("stopped", timeout=WAIT_MS)

        sent = sent_messages(page, "and then?")

        assert [m["content"] for m in sent] == ["tell me a story", "Once upon a time", "and then?"]
        expect(page.locator("#transcript .msg.assistant")).to_have_text(["Once upon a time", "Fine."])
    finally:
        silent.set()
        context.close()
        edge.close()

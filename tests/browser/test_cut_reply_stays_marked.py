"""A reply kept in the conversation though it did not end by itself, in a real browser: stopped
(a real edge whose replica writes slowly) or cut by the user's token budget (a scripted edge: the
budget's stop cannot be timed on a real one). Only the status line said so, until the next turn
overwrote it: from then on the cut reply looked like one the model had ended, and after a reload
too. Each is marked under its bubble for good now."""

from __future__ import annotations

import re

from playwright.sync_api import Browser, expect

from edge.routes.playground import PLAYGROUND
from edge.sse import DONE, ChunkEncoder
from edge.token_relay import TOKENS_LIMIT_MARKER
from tests.browser.conftest import SMALL, WAIT_MS, PacedReplica, send_from_the_page, turn
from tests.client.scripted_edge import ScriptedEdge, served
from tests.support.live_server import LiveServer


def test_a_stopped_reply_stays_marked_stopped_after_the_next_turn(
    browser: Browser, paced_server: tuple[LiveServer, PacedReplica]
) -> None:
    server, replica = paced_server
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.base_url + "/")
        page.fill("#api-key", server.keys["paid"])
        page.check("#remember-key")
        page.fill("#max-tokens", "2000")
        page.fill("#prompt", "tell me a long story")
        page.click("#send")
        replies = page.locator("#transcript .msg.assistant")
        expect(replies.first).to_have_text(re.compile(".{20}"), timeout=WAIT_MS)
        page.click("#stop")
        expect(page.locator("#status-state")).to_have_text("stopped", timeout=WAIT_MS)
        assert replica.running == 0  # the server's work ended with it

        turn(page, "and then?", 4)

        notes = page.locator("#transcript .cut-note")
        expect(notes).to_have_text(["stopped"])
        # The note is the stopped reply's, the one before the second question.
        assert page.evaluate(
            "() => document.querySelector('#transcript .cut-note').previousElementSibling === "
            "document.querySelector('#transcript .msg.assistant')"
        )
        # And read back from the edge's history after a reload.
        page.reload()
        expect(page.locator("#transcript .msg.user")).to_have_count(2, timeout=WAIT_MS)
        expect(notes).to_have_text(["stopped"])
    finally:
        context.close()


def test_a_reply_cut_by_the_budget_stays_marked_after_the_next_turn(browser: Browser) -> None:
    encoder = ChunkEncoder("chatcmpl-cut", SMALL, 0)
    cut = encoder.final("length", TOKENS_LIMIT_MARKER)  # the budget's end, as the edge writes it
    whole = ChunkEncoder("chatcmpl-whole", SMALL, 0)
    edge = ScriptedEdge(
        [
            encoder.first() + encoder.delta("Once upon a") + cut + DONE,
            whole.first() + whole.delta("Fine.") + whole.final("stop", None) + DONE,
        ],
        pages={"/": served(PLAYGROUND.read_bytes())},
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "tell me a story")
        expect(page.locator("#status-state")).to_have_text("stopped: tokens budget used up", timeout=WAIT_MS)

        turn(page, "go on", 4)

        expect(page.locator("#transcript .msg.assistant")).to_have_text(["Once upon a", "Fine."])
        expect(page.locator("#transcript .cut-note")).to_have_text(["stopped: tokens budget used up"])
    finally:
        context.close()
        edge.close()

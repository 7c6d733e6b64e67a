"""An error event before the reply's first text, carrying the edge's retry hint (`retry_after_ms`,
`should_retry`: edge/errors.py in_stream). A replica restarting or this instance draining: the turn
had not begun and the edge says to send it again, which the Python client's auto_retry does; the
page ignored the hint and showed the failure (a draining instance's with no wait at all). It now
sends the turn again once, after the edge's wait, and else shows the failure with when to retry; a
failure the edge says not to send again (the request may be what killed its replica) is shown as is.

The edge's own encodings, from a scripted server (tests/client/scripted_edge.py): a real edge's
replica cannot be made to fail at a chosen moment from here."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from edge.errors import ApiError, in_stream, shutting_down_error, upstream_error
from edge.routes.playground import PLAYGROUND
from edge.sse import DONE, ChunkEncoder, event
from tests.browser.conftest import SMALL, send_from_the_page
from tests.client.scripted_edge import ScriptedEdge, served

WAIT_MS = 30_000
RESTARTING = upstream_error(0.2)
FINAL = upstream_error(None, final=True)


def failed(error: ApiError) -> bytes:
    encoder = ChunkEncoder("chatcmpl-failed", SMALL, 0)
    return encoder.first() + encoder.usage(3, 0) + event({"error": in_stream(error)}) + DONE


def answered() -> bytes:
    encoder = ChunkEncoder("chatcmpl-answered", SMALL, 0)
    return encoder.first() + encoder.delta("hello") + encoder.final("stop", None) + encoder.usage(3, 1) + DONE


def scripted(*scripts: bytes) -> ScriptedEdge:
    return ScriptedEdge(list(scripts), pages={"/": served(PLAYGROUND.read_bytes())})


@pytest.mark.parametrize("error", [RESTARTING, shutting_down_error()], ids=["replica-restarting", "draining"])
def test_a_failure_before_any_text_that_the_edge_says_to_retry_is_sent_again(
    browser: Browser, error: ApiError
) -> None:
    edge = scripted(failed(error), answered())
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "hello?")
        expect(page.locator("#status-state")).to_have_attribute("data-state", "done", timeout=WAIT_MS)
        expect(page.locator("#transcript .msg.assistant")).to_have_text("hello")
        assert edge.requests == 2
        assert page.evaluate("chat.messages.map(m => m.role + ':' + m.content)") == [
            "user:hello?",
            "assistant:hello",
        ]
    finally:
        context.close()
        edge.close()


def test_it_is_sent_again_once_then_shown_with_when_to_retry(browser: Browser) -> None:
    edge = scripted(failed(RESTARTING))  # every attempt fails so
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "hello?")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(state).to_have_text("The model replica failed while generating. Try again in 0.2 s.")
        assert edge.requests == 2
        expect(page.locator("#prompt")).to_have_value("hello?")
    finally:
        context.close()
        edge.close()


def test_a_failure_the_edge_says_not_to_send_again_is_not(browser: Browser) -> None:
    edge = scripted(failed(FINAL), answered())
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "hello?")
        state = page.locator("#status-state")
        expect(state).to_have_attribute("data-state", "error", timeout=WAIT_MS)
        expect(state).to_have_text("The model replica failed while generating.")
        assert edge.requests == 1
    finally:
        context.close()
        edge.close()


def test_stop_while_it_waits_to_send_again_ends_the_turn_unsent(browser: Browser) -> None:
    edge = scripted(failed(upstream_error(8.0)), answered())
    context = browser.new_context()
    try:
        page = context.new_page()
        send_from_the_page(page, edge.base_url, "hello?")
        state = page.locator("#status-state")
        expect(state).to_contain_text("retrying in", timeout=WAIT_MS)
        page.click("#stop")
        # At once, not after the edge's wait: nothing runs on the server to be cancelled.
        expect(state).to_have_attribute("data-state", "stopped", timeout=4000)
        assert (edge.requests, edge.cancels) == (1, 0)
        expect(page.locator("#prompt")).to_have_value("hello?")
        assert page.evaluate("chat.messages.length") == 0
    finally:
        context.close()
        edge.close()
